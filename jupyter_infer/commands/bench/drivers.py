"""Driving a workload through our in-process service, with every token's arrival time.

``loadgen.drive_service`` sends arrivals and keeps TTFT and latency; the benchmark's newer
workloads need more: agents' chains (the next round when the previous answer is complete),
a late request sent once the others are streaming, and each token's time (inter-token gaps).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import InferError
from ...values.metrics import percentile
from ..loadgen import Arrival
from .workloads import Workload


@dataclass
class Trace:
    """What one request saw: when it was sent, each token's arrival, its answer's counts."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    token_index: list[int] = field(default_factory=list)  # how many tokens each event completes
    tokens: int = 0
    ttft_ms: float | None = None
    done: float | None = None
    late: bool = False
    error: str | None = None

    @property
    def latency_ms(self) -> float | None:
        return None if self.done is None else (self.done - self.sent) * 1000

    @property
    def gaps_ms(self) -> list[float]:
        """Times between consecutive tokens (ms). A token whose text was held back (half a
        UTF-8 character, a possible stop string) arrives with a later one: such an event
        spans several steps, and says nothing about the gap between two of them."""
        t, n = self.token_times, self.token_index
        return [(t[i] - t[i - 1]) * 1000 for i in range(1, len(t)) if not n or n[i] - n[i - 1] == 1]


async def drive(service: Any, workload: Workload) -> tuple[list[Trace], float]:
    """Send ``workload`` to a started ``InferenceService``; every trace, and the wall time
    from the first send to the last answer."""
    from ...values.request import Request, SamplingParams

    await service.wait_ready()
    loop = asyncio.get_running_loop()
    start = loop.time()
    traces: list[Trace] = []
    streaming = asyncio.Event()  # every arrival has streamed late_after tokens

    async def one(item: Arrival, late: bool = False) -> Trace:
        trace = Trace(time.monotonic(), late=late)
        traces.append(trace)
        try:
            stream = await service.submit(Request(item.prompt, SamplingParams(max_tokens=item.max_tokens)))
            async for event in stream:
                trace.token_times.append(time.monotonic())
                trace.token_index.append(event.index)
                if workload.late and not late and not streaming.is_set() and _all_streaming():
                    streaming.set()
            result = await stream.result()
        except InferError as err:
            trace.error = type(err).__name__
            streaming.set()  # a late request must not wait for a stream that failed
            return trace
        trace.done = time.monotonic()
        trace.tokens = result.completion_tokens
        trace.ttft_ms = result.ttft_ms  # the scheduler's own first-token time (see loadgen)
        return trace

    def _all_streaming() -> bool:
        early = [t for t in traces if not t.late]
        return len(early) == len(workload.arrivals) and all(
            len(t.token_times) >= workload.late_after for t in early)

    async def at(item: Arrival) -> Trace:
        delay = start + item.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return await one(item)

    async def chain(items: list[Arrival]) -> None:
        for item in items:
            if (await at(item)).error:
                return

    async def late() -> None:
        await streaming.wait()
        await one(workload.late, late=True)

    tasks = [at(a) for a in workload.arrivals] + [chain(c) for c in workload.chains]
    if workload.late is not None:
        tasks.append(late())
    await asyncio.gather(*tasks)
    end = max((t.done for t in traces if t.done is not None), default=loop.time())
    return traces, end - min(t.sent for t in traces)


def interference_stats(traces: list[Trace]) -> dict[str, Any]:
    """The running streams' worst gap between two tokens and their ITL p99; the late
    prompt's TTFT (all in ms)."""
    gaps = [g for t in traces if not t.late for g in t.gaps_ms]
    late = next((t for t in traces if t.late), None)
    return {
        "worst_gap_ms": max(gaps, default=None),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
        "long_ttft_ms": late.ttft_ms if late else None,
    }
