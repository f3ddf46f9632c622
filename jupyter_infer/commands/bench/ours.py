"""Ours: our scheduler in-process over the hf engine, and our server in a real ``jupyter server``
process over HTTP + SSE."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from ..loadgen import Outcome, drive_http
from .contenders import Contender, Run
from .drivers import drive, interference_stats
from .workloads import Workload

KV_SAMPLE_S = 0.02  # how often a run samples the KV memory its rows hold


async def _watch_kv(service: Any, peak: dict[str, float]) -> None:
    """Sample the KV memory the running rows hold until cancelled. Keep the moment they held
    the most tokens (what their tokens needed then, and the bytes held then: the layout's
    overhead when it matters most) and the most bytes held at any time."""
    while True:
        usage = service.kv_cache()
        if usage:
            needed = usage["tokens_held"] * usage["bytes_per_token"]
            if needed and needed >= peak.get("kv_peak_needed_bytes", 0):
                peak.update(kv_peak_bytes=usage["bytes_held"], kv_peak_needed_bytes=needed,
                            kv_peak_mb=usage["bytes_held"] / 2**20, kv_peak_needed_mb=needed / 2**20)
            peak["kv_max_mb"] = max(peak.get("kv_max_mb", 0.0), usage["bytes_held"] / 2**20)
        await asyncio.sleep(KV_SAMPLE_S)


def _require_ok(outcomes: list[Outcome], who: str) -> None:
    """A run with failed requests measures nothing: stop the benchmark and say why."""
    failed = [o.error for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{who}: {len(failed)} requests failed: {failed[:3]}")


class OurScheduler(Contender):
    """Our scheduler (``window`` or ``continuous``) in-process, over the hf engine.

    Every run starts with an empty prefix cache (``prefix_cache_mb`` of it; 0: none), so
    repeated runs of one workload do not feed each other.
    """

    def __init__(self, engine: Any, mode: str, max_batch_size: int, *, name: str | None = None,
                 label: str | None = None, prefix_cache_mb: float | None = None,
                 prefill_chunk_tokens: int | None = None) -> None:
        from ...values.config import ServiceConfig

        self.engine = engine
        self.mode = mode
        self.max_batch_size = max_batch_size
        self.name = name or mode
        self.label = label or f"ours: {mode}"
        self.prefix_cache_mb = ServiceConfig.default("prefix_cache_mb") if prefix_cache_mb is None else prefix_cache_mb
        self.prefill_chunk_tokens = prefill_chunk_tokens  # None: the engine's own choice

    def run(self, workload: Workload) -> Run:
        self.engine.configure_prefix_cache(self.prefix_cache_mb)
        return asyncio.run(self._run(workload))

    async def _run(self, workload: Workload) -> Run:
        from ...service.inference import InferenceService
        from ...values.config import ServiceConfig

        requests = workload.requests
        service = InferenceService(ServiceConfig(
            mode=self.mode, max_batch_size=self.max_batch_size, max_queue_size=max(256, len(requests)),
            max_new_tokens=max(512, max(a.max_tokens for a in requests)),
            prefill_chunk_tokens=self.prefill_chunk_tokens, prefix_cache_mb=self.prefix_cache_mb,
        ), engine_loader=lambda: self.engine)
        service.start()
        peak: dict[str, float] = {}
        watcher = asyncio.ensure_future(_watch_kv(service, peak))
        try:
            traces, wall = await drive(service, workload)
        finally:
            watcher.cancel()
            await service.stop()
        failed = [t.error for t in traces if t.error]
        if failed:
            raise RuntimeError(f"{self.label}: {len(failed)} requests failed: {failed[:3]}")
        snap = service.metrics()
        busy = service.collector.busy_s
        extra = {
            "engine_busy_s": busy,
            # Time the engine thread sat idle while work existed: scheduling, asyncio hops.
            "overhead_share": max(0.0, 1 - busy / wall) if wall else None,
            "mean_batch_size": snap["mean_batch_size"],
            "batches": len(service.collector.batches),
            **peak,
        }
        cache = snap.get("prefix_cache") or {}
        if cache.get("enabled"):
            extra.update(prefix_hits=cache["hits"], prefix_misses=cache["misses"],
                         prefix_reused_tokens=cache["reused_tokens"], prefix_cache_mb=cache["used_mb"])
        if workload.late is not None:
            extra.update(interference_stats(traces))
        return Run(wall, sum(t.tokens for t in traces), [t.ttft_ms for t in traces],
                   [t.latency_ms for t in traces], extra)


class StandalonePrefill(OurScheduler):
    """The interference workload's long prompt alone, prefilled whole: the cost to compare with."""

    def __init__(self, engine: Any, max_batch_size: int) -> None:
        super().__init__(engine, "continuous", max_batch_size, name="standalone",
                         label="long prompt alone (whole prefill)", prefill_chunk_tokens=0)

    def supports(self, workload: Workload) -> bool:
        return workload.late is not None

    def run(self, workload: Workload) -> Run:
        alone = Workload(workload.name, "the late prompt alone", [workload.late])
        run = super().run(alone)
        run.extra["long_ttft_ms"] = run.ttft_ms[0]
        return run


class LengthsApart(Contender):
    """What the mixed-lengths workload should cost when a long prompt does not tax every row:
    as many rows, all short (its short prompts, the first twice in the long one's place), as
    one burst, plus the long prompt's prefill alone."""

    name, label = "apart", "all short + the long prefill alone"

    def __init__(self, engine: Any, max_batch_size: int) -> None:
        self.shorts = OurScheduler(engine, "continuous", max_batch_size, prefix_cache_mb=0)
        self.alone = OurScheduler(engine, "continuous", max_batch_size, prefix_cache_mb=0, prefill_chunk_tokens=0)

    def supports(self, workload: Workload) -> bool:
        return workload.name == "lengths"

    def run(self, workload: Workload) -> Run:
        long_, *shorts = workload.arrivals
        short_run = self.shorts.run(Workload(workload.name, "short prompts only", [shorts[0], *shorts]))
        prefill = self.alone.run(Workload(workload.name, "the long prompt", [replace(long_, max_tokens=1)]))
        prefill_s = prefill.ttft_ms[0] / 1000
        return Run(short_run.wall_s + prefill_s, short_run.tokens, short_run.ttft_ms, short_run.latency_ms,
                   {"shorts_wall_s": short_run.wall_s, "long_prefill_s": prefill_s,
                    **{k: v for k, v in short_run.extra.items() if k.startswith("kv_")}})


class OverHTTP(Contender):
    """Our server (``continuous``) in a real ``jupyter server`` process, driven over HTTP + SSE.

    Through ``jupyter_infer.Client`` (explicit URL and token): each request is an ``astream``
    task on the client's I/O loop, with its own connection while they overlap.
    """

    name, label = "http", "ours over HTTP+SSE"

    def __init__(self, model_dir: str, dtype: str, num_threads: int, max_batch_size: int, log_path: str | None = None,
                 **options: Any) -> None:
        from ...kernel.client import Client
        from ...kernel.launcher import LocalServer

        started = time.perf_counter()
        self.server = LocalServer(engine="hf", model=model_dir, dtype=dtype, num_threads=num_threads, mode="continuous",
                                  max_batch_size=max_batch_size, log_path=log_path, **options)
        self.server.start()
        self.client = Client(self.server.url, self.server.token, embedded=False)
        try:
            status = self.client.wait_ready(timeout=600)
            if status.get("engine") != "hf":
                raise RuntimeError(f"the server did not load the hf engine: {status}")
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - started

    def pids(self) -> list[int]:
        return [self.server.pid] if self.server.pid else []

    def _completion_tokens(self) -> int:
        return int(self.client.metrics()["tokens"]["completion"])

    def run(self, workload: Workload) -> Run:
        before = self._completion_tokens()
        outcomes, wall = drive_http(self.client, workload.arrivals)
        _require_ok(outcomes, "over HTTP")
        return Run(wall, self._completion_tokens() - before,
                   [o.ttft_ms for o in outcomes], [o.latency_ms for o in outcomes])

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.server.stop()
