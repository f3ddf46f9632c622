"""Everyone the benchmark measures, each behind the same two calls: ``warmup`` and ``run``.

All of them share the machine, the model weights (one ``HFEngine``'s model, except
transformers' own continuous batching, which switches its model's attention to a paged
implementation and so gets its own copy), the prompts and the token counts. Greedy
decoding; EOS never ends a request early (``min_new_tokens`` for ``generate``,
``eos_token_id=-1`` for transformers' manager, an empty EOS set for our engine).

This module holds what they have in common: the ``Contender`` calls, the ``Run`` each timed
run returns, and the fresh thread each runs in. The contenders themselves, by kind: ``ours``
(our scheduler in-process and our server over HTTP), ``ceiling`` (bare decode steps) and
``completions`` (any OpenAI server, ours included, over HTTP); the repository's
``benchmarks/`` adds ``generate`` (one at a time, one padded batch), transformers' continuous
batching manager and the other servers.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...values.metrics import percentile
from .workloads import Workload

T = TypeVar("T")


async def serving(engine: Any, work: Callable[[Any], Awaitable[T]], **config: Any) -> T:
    """``work(service)`` on a fresh service over ``engine``: continuous, 32 rows, no prefix
    cache, unless ``config`` (``ServiceConfig`` options) says otherwise; its result."""
    from ...service.inference import InferenceService
    from ...values.config import ServiceConfig

    options = {"mode": "continuous", "max_batch_size": 32, "max_new_tokens": 512, "prefix_cache_mb": 0, **config}
    engine.configure_prefix_cache(options["prefix_cache_mb"])
    service = InferenceService(ServiceConfig(**options), engine_loader=lambda: engine)
    service.start()
    try:
        await service.wait_ready()
        return await work(service)
    finally:
        await service.stop()


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


class Contender:
    name = ""
    label = ""
    closed_only = False  # needs every request up front (a padded batch)

    def supports(self, workload: Workload) -> bool:
        return workload.closed or not self.closed_only

    def warmup(self, workload: Workload) -> None:
        self.run(workload)

    def pids(self) -> list[int]:
        """Processes whose CPU time is this contender's own (the server it measures), not
        noise from other processes."""
        return []

    def run(self, workload: Workload) -> Run:
        raise NotImplementedError

    def close(self) -> None:
        pass
