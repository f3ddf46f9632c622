"""Everyone the benchmark measures, each behind the same two calls: ``warmup`` and ``run``.

All of them share the machine, the model weights (one ``HFEngine``'s model, except
transformers' own continuous batching, which switches its model's attention to a paged
implementation and so gets its own copy), the prompts and the token counts. Greedy
decoding; EOS never ends a request early (``min_new_tokens`` for ``generate``,
``eos_token_id=-1`` for transformers' manager, an empty EOS set for our engine).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ..engine.hf import left_pad_rows
from ..loadgen import Outcome, drive_http, drive_service
from ..metrics import percentile
from .workloads import Workload

T = TypeVar("T")


def in_fresh_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a new thread that ends with it, and return its result (or raise).

    Why: each thread that runs torch ops keeps its own OpenMP thread team, and once the
    process holds more OpenMP threads than CPUs, libgomp stops spin-waiting between
    parallel regions. A decode step is many short regions, so a team left alive on the
    main thread by one contender slowed the next contender's engine thread by ~15 % on
    2 cores. With every contender in a thread of its own that exits afterwards, only one
    team is alive at a time, as in the server, where only the engine thread runs torch.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="bench-contender")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


@dataclass
class Run:
    """One timed run of one contender on one workload (times in ms from each arrival)."""

    wall_s: float
    tokens: int
    ttft_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens / self.wall_s if self.wall_s > 0 else None,
            "ttft_p50_ms": percentile(self.ttft_ms, 50),
            "ttft_p99_ms": percentile(self.ttft_ms, 99),
            "latency_p50_ms": percentile(self.latency_ms, 50),
            "latency_p99_ms": percentile(self.latency_ms, 99),
            **self.extra,
        }


def _require_ok(outcomes: list[Outcome], who: str) -> None:
    """A run with failed requests measures nothing: stop the benchmark and say why."""
    failed = [o.error for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{who}: {len(failed)} requests failed: {failed[:3]}")


class Contender:
    name = ""
    label = ""
    closed_only = False  # needs every request up front (a padded batch)

    def supports(self, workload: Workload) -> bool:
        return workload.closed or not self.closed_only

    def warmup(self, workload: Workload) -> None:
        self.run(workload)

    def run(self, workload: Workload) -> Run:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Clock:
    """A ``generate`` streamer that only notes when tokens come out (its first put is the prompt)."""

    def __init__(self) -> None:
        self.puts: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(time.perf_counter())

    def end(self) -> None:
        pass

    @property
    def first_token(self) -> float | None:
        return self.puts[1] if len(self.puts) > 1 else None


def _generate(model: Any, rows: list[list[int]], new_tokens: int, pad_id: int) -> tuple[torch.Tensor, _Clock]:
    """One ``model.generate`` call over left-padded ``rows``, greedy, exactly ``new_tokens``."""
    ids, mask = left_pad_rows(rows, pad_id)
    clock = _Clock()
    out = model.generate(
        input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=pad_id, streamer=clock,
    )
    return out[:, ids.shape[1]:], clock


class Sequential(Contender):
    """The naive server: ``model.generate`` for one request at a time, in arrival order."""

    name, label, closed_only = "sequential", "sequential generate", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def warmup(self, workload: Workload) -> None:
        self.run(Workload(workload.name, "warm-up", workload.arrivals[:2]))

    def run(self, workload: Workload) -> Run:
        start = time.perf_counter()
        ttft, latency, tokens = [], [], 0
        for arrival in workload.arrivals:
            out, clock = _generate(self.engine.model, [self.engine.tokenize(arrival.prompt)],
                                   arrival.max_tokens, self.engine.pad_token_id)
            done = time.perf_counter()
            tokens += out.shape[1]
            ttft.append((clock.first_token - start) * 1000)
            latency.append((done - start) * 1000)
        return Run(time.perf_counter() - start, tokens, ttft, latency)


class StaticBatch(Contender):
    """Static batching: one padded ``model.generate`` call for the whole burst.

    Every row runs to the longest output; only the tokens each request asked for count.
    """

    name, label, closed_only = "static", "static batch (padded generate)", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run(self, workload: Workload) -> Run:
        rows = [self.engine.tokenize(a.prompt) for a in workload.arrivals]
        longest = max(a.max_tokens for a in workload.arrivals)
        start = time.perf_counter()
        out, clock = _generate(self.engine.model, rows, longest, self.engine.pad_token_id)
        done = time.perf_counter()
        n = len(rows)
        return Run(
            done - start, workload.total_tokens,
            [(clock.first_token - start) * 1000] * n, [(done - start) * 1000] * n,
            {"padded_tokens": int(out.numel())},
        )


class OurScheduler(Contender):
    """Our scheduler (``window`` or ``continuous``) in-process, over the hf engine."""

    def __init__(self, engine: Any, mode: str, max_batch_size: int) -> None:
        self.engine = engine
        self.mode = mode
        self.max_batch_size = max_batch_size
        self.name = mode
        self.label = f"ours: {mode}"

    def run(self, workload: Workload) -> Run:
        return asyncio.run(self._run(workload))

    async def _run(self, workload: Workload) -> Run:
        from ..config import ServiceConfig
        from ..service import InferenceService

        service = InferenceService(ServiceConfig(
            mode=self.mode, max_batch_size=self.max_batch_size, max_queue_size=max(256, len(workload.arrivals)),
            max_new_tokens=max(512, max(a.max_tokens for a in workload.arrivals)),
        ), engine_loader=lambda: self.engine)
        service.start()
        try:
            outcomes, wall = await drive_service(service, workload.arrivals)
        finally:
            await service.stop()
        _require_ok(outcomes, self.mode)
        snap = service.metrics()
        busy = service.collector.busy_s
        return Run(
            wall, sum(o.tokens for o in outcomes),
            [o.ttft_ms for o in outcomes], [o.latency_ms for o in outcomes],
            {
                "engine_busy_s": busy,
                # Time the engine thread sat idle while work existed: scheduling, asyncio hops.
                "overhead_share": max(0.0, 1 - busy / wall) if wall else None,
                "mean_batch_size": snap["mean_batch_size"],
                "batches": len(service.collector.batches),
            },
        )


class TransformersContinuous(Contender):
    """transformers' built-in continuous batching: one ``ContinuousBatchingManager``, kept.

    Its default cache sizing takes most of free memory, so the cache is sized explicitly
    for this workload: small pages, enough blocks for every request's prompt and output.
    The manager lives for the whole benchmark (``keep_for_next_session``), but its generation
    thread runs only during its own runs: an idle manager thread slowed the other
    contenders' ``generate`` by ~12 % in our measurements, which would flatter this one.
    """

    name, label = "hf_cb", "transformers continuous batching"

    def __init__(self, model_dir: str, tokenize: Callable[[str], list[int]], dtype: torch.dtype,
                 max_batch_size: int, max_tokens_per_request: int, page_size: int = 32,
                 device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        pad = self.model.generation_config.pad_token_id
        blocks = max_batch_size * math.ceil(max_tokens_per_request / page_size) + 8
        self.cache_config = {"page_size": page_size, "num_blocks": blocks,
                             "max_batch_tokens": 1024, "max_requests_per_batch": max_batch_size}
        self._configs = {
            "generation_config": GenerationConfig(
                max_new_tokens=64, do_sample=False, eos_token_id=-1, pad_token_id=0 if pad is None else pad,
            ),
            "continuous_batching_config": ContinuousBatchingConfig(
                **self.cache_config, allow_block_sharing=False, use_cuda_graph=False, use_async_batching=False,
            ),
        }
        self.manager = self.model.init_continuous_batching(**self._configs)
        self.tokenize = tokenize

    def _resume(self) -> None:
        """Start the manager's generation thread; return once it can take requests."""
        # After the first session this returns the same, cached manager.
        self.manager = self.model.init_continuous_batching(**self._configs)
        self.manager.batch_processor = None  # the thread builds a fresh one: wait for it
        self.manager.start()
        deadline = time.monotonic() + 60
        while self.manager.batch_processor is None:
            if not self.manager.is_running() or time.monotonic() > deadline:
                raise RuntimeError("transformers' continuous batching manager did not start")
            time.sleep(0.001)

    def _pause(self) -> None:
        self.manager.stop(block=True, timeout=30, keep_for_next_session=True)

    def run(self, workload: Workload) -> Run:
        rows = [self.tokenize(a.prompt) for a in workload.arrivals]
        self._resume()
        try:
            return self._run(workload, rows)
        finally:
            self._pause()

    def _run(self, workload: Workload, rows: list[list[int]]) -> Run:
        start = time.perf_counter()

        def feed() -> None:
            for arrival, row in zip(workload.arrivals, rows, strict=True):
                delay = start + arrival.at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self.manager.add_request(row, max_new_tokens=arrival.max_tokens, eos_token_id=-1,
                                         record_timestamps=True)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        results: dict[str, Any] = {}
        while len(results) < len(rows):
            result = self.manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError("transformers' continuous batching manager stopped answering")
            if result.is_finished():
                if result.error:
                    raise RuntimeError(f"transformers' continuous batching failed: {result.error}")
                results[result.request_id] = result
        feeder.join()
        end = max(r.lifespan[1] for r in results.values())
        return Run(
            end - start, sum(len(r.generated_tokens) for r in results.values()),
            [(r.timestamps[0] - r.created_time) * 1000 for r in results.values()],
            [(r.lifespan[1] - r.created_time) * 1000 for r in results.values()],
        )

    def close(self) -> None:
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=10)
        self.model._cached_continuous_batching_manager = None


class DecodeCeiling(Contender):
    """The ceiling: the raw cost of decode steps with the KV cache and no scheduling at all.

    Prefills every row (not counted), then times only the bare forward + argmax of each
    decode step, each step running exactly the rows that still want tokens. Tokens per
    second over those steps is what no scheduler on this machine can beat.
    """

    name, label, closed_only = "ceiling", "ceiling (bare decode steps)", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run(self, workload: Workload) -> Run:
        from transformers import DynamicCache

        model = self.engine.model
        device = model.device
        rows = [self.engine.tokenize(a.prompt) for a in workload.arrivals]
        want = torch.tensor([a.max_tokens for a in workload.arrivals])
        ids, mask = (t.to(device) for t in left_pad_rows(rows, self.engine.pad_token_id))
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                        cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
            last = out.logits[:, -1].argmax(-1)
            prefill_s = time.perf_counter() - t0
            cache, positions = out.cache, mask.sum(-1)
            decode_s, tokens, step = 0.0, 0, 1
            alive = torch.arange(len(rows))
            while True:
                keep = (want[alive] > step).nonzero().flatten()
                if len(keep) == 0:
                    break
                if len(keep) < len(alive):  # rows that are done leave, as they would in any good scheduler
                    index = keep.to(device)
                    for layer in cache.layers:
                        layer.keys, layer.values = layer.keys[index], layer.values[index]
                    mask, positions, last, alive = mask[index], positions[index], last[index], alive[keep]
                mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
                t = time.perf_counter()
                out = model(input_ids=last[:, None], attention_mask=mask, position_ids=positions[:, None],
                            cache=cache, use_cache=True)
                last = out.logits[:, -1].argmax(-1)
                decode_s += time.perf_counter() - t
                cache, positions, tokens, step = out.cache, positions + 1, tokens + len(alive), step + 1
        total = time.perf_counter() - t0
        return Run(decode_s, tokens, extra={
            "prefill_s": prefill_s,
            "decode_step_ms": decode_s / max(step - 1, 1) * 1000,
            # The same bare loop counted end to end, prefill included: the practical best.
            "bare_loop_tokens_per_s": workload.total_tokens / total,
        })


class OverHTTP(Contender):
    """Our server (``continuous``) in a real ``jupyter server`` process, driven over HTTP + SSE.

    Through ``jupyter_infer.Client`` (explicit URL and token): each request is an ``astream``
    task on the client's I/O loop, with its own connection while they overlap.
    """

    name, label = "http", "ours over HTTP+SSE"

    def __init__(self, model_dir: str, dtype: str, num_threads: int, max_batch_size: int, log_path: str | None = None) -> None:
        from ..client import Client
        from ..server.launcher import LocalServer

        started = time.perf_counter()
        self.server = LocalServer(engine="hf", model=model_dir, dtype=dtype, num_threads=num_threads, mode="continuous",
                                  max_batch_size=max_batch_size, log_path=log_path)
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
