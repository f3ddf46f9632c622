"""[j] users (issue 21): one user's burst and another user's few short requests, fair share on and off.

User A sends a burst of many long requests at once (several times the batch); while it runs,
user B sends a few short ones, spread over the burst: the first once A's rows decode, the i-th
once A has streamed i/(B's requests + 1) of its tokens (whether or not B's earlier ones have
been answered: B is several cells of a notebook, or several agents). The figure is B's TTFT (p50), and A's burst throughput:

- ``fair``: our service with fair share (the default): B's request takes the row of A's
  newest, which is parked and resumes later;
- ``fifo``: ``fair_share`` off, priority + FIFO for everyone: B waits behind the burst;
- ``idle``: B's requests alone on an idle server (what B gets when nobody else asks).

Every contender runs our service over the bench's one ``HFEngine`` (greedy, EOS off, no
prefix cache), in process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..loadgen import Arrival
from .contenders import Contender, Run, serving
from .workloads import Workload, bench_prompts

BATCH = 16  # rows: the burst is several times this


def users_workload(count: Callable[[str], int], a_requests: int, a_tokens: int, b_requests: int,
                   b_tokens: int) -> Workload:
    prompts = bench_prompts(count, a_requests + b_requests)
    return Workload(
        "users", f"user A: {a_requests} requests x {a_tokens} tokens at once ({BATCH} rows); user B: {b_requests} "
        f"requests x {b_tokens} tokens, spread over A's burst",
        [Arrival(0.0, p, a_tokens) for p in prompts[:a_requests]]
        + [Arrival(1.0, p, b_tokens) for p in prompts[a_requests:]],  # at: 1 marks B's (sent as above)
    )


class Users(Contender):
    def __init__(self, engine: Any, name: str, label: str, *, fair_share: bool = True, burst: bool = True) -> None:
        self.engine, self.name, self.label = engine, name, label
        self.fair_share, self.burst = fair_share, burst

    def warmup(self, workload: Workload) -> None:
        """A few of the burst's requests and one of B's: the engine's first steps, not the whole run."""
        a = [x for x in workload.arrivals if x.at == 0.0][:BATCH]
        b = [x for x in workload.arrivals if x.at > 0.0][:1]
        self.run(Workload(workload.name, "", [Arrival(0.0, x.prompt, 8) for x in a] + b))

    def run(self, workload: Workload) -> Run:
        return asyncio.run(serving(self.engine, lambda service: self._users(service, workload), max_batch_size=BATCH,
                                   max_new_tokens=1024, max_queue_size=1024, fair_share=self.fair_share))

    async def _users(self, service: Any, workload: Workload) -> Run:
        from ...values.request import Request, SamplingParams

        a = [x for x in workload.arrivals if x.at == 0.0]
        b = [x for x in workload.arrivals if x.at > 0.0]
        started = time.monotonic()

        streamed = [0]  # A's tokens so far

        async def one(owner: str, arrival: Arrival) -> Any:
            stream = await service.submit(Request(arrival.prompt, SamplingParams(max_tokens=arrival.max_tokens),
                                                  owner=owner))
            async for _ in stream:
                streamed[0] += owner == "A"
            return await stream.result()

        burst = [asyncio.ensure_future(one("A", x)) for x in a] if self.burst else []
        a_total = sum(x.max_tokens for x in a)

        async def until(ready: Callable[[], bool]) -> None:
            while burst and not ready():
                await asyncio.sleep(0.001)

        async def b_request(i: int, x: Arrival) -> tuple[Any, bool]:
            await until(lambda: streamed[0] >= max(1, i * a_total // (len(b) + 1)))
            result = await one("B", x)
            return result, bool(burst) and not all(t.done() for t in burst)

        answered = await asyncio.gather(*(b_request(i, x) for i, x in enumerate(b)))
        b_results = [r for r, _ in answered]
        overlapped = sum(during for _, during in answered)
        a_results = await asyncio.gather(*burst)
        a_wall = max((r.total_ms for r in a_results), default=0.0) / 1000
        a_tokens = sum(r.completion_tokens for r in a_results)
        metrics = service.metrics()
        return Run(
            wall_s=time.monotonic() - started,
            tokens=a_tokens + sum(r.completion_tokens for r in b_results),
            ttft_ms=[r.ttft_ms for r in b_results if r.ttft_ms is not None],
            latency_ms=[r.total_ms for r in b_results],
            extra={"a_tokens_per_s": a_tokens / a_wall if a_wall else None,
                   "a_wall_s": a_wall, "b_during_burst": overlapped, "parked_rows": metrics["parked_rows"]},
        )


def contenders(engine: Any) -> list[Contender]:
    return [
        Users(engine, "fair", "ours: fair share (default)"),
        Users(engine, "fifo", "ours: fair_share off (FIFO)", fair_share=False),
        Users(engine, "idle", "B alone (idle server)", burst=False),
    ]
