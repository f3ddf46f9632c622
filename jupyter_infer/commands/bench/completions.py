"""An OpenAI-compatible server as a contender, driven by one client: streamed
``POST /v1/completions`` (greedy), each request on its own connection, all sent at their
arrival times. TTFT is the first chunk with text minus the send, latency the end of the
stream minus the send; tokens are the final ``usage.completion_tokens`` (the number of text
chunks where a server gives no usage). Ours (``infer/v1/completions``) and, in
``benchmarks/``, the other servers run through it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from ..loadgen import Arrival
from .contenders import Contender, Run
from .drivers import Trace
from .workloads import Workload


async def stream_completions(base_url: str, model: str, arrivals: list[Arrival], *,
                             chains: list[list[Arrival]] | None = None,
                             headers: dict[str, str] | None = None,
                             extra: dict[str, Any] | None = None) -> tuple[list[Trace], float]:
    """Stream every arrival as an OpenAI completion, and each chain's requests one after the
    other; the traces and the wall time from the first send to the last answer."""
    import httpx

    loop = asyncio.get_running_loop()
    start = loop.time()
    chains = chains or []
    limits = httpx.Limits(max_connections=len(arrivals) + len(chains) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, headers=headers or {}, timeout=600, limits=limits) as client:

        async def one(item: Arrival) -> Trace:
            delay = start + item.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0,
                    "stream": True, **(extra or {})}
            trace = Trace(time.monotonic())
            chunks, usage = 0, None
            try:
                async with client.stream("POST", "completions", json=body) as response:
                    if response.status_code != 200:
                        trace.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                        return trace
                    async for line in response.aiter_lines():
                        if not line.startswith("data:") or line.strip() == "data: [DONE]":
                            continue
                        data = json.loads(line[5:])
                        if "error" in data:
                            trace.error = str(data["error"])[:200]
                            return trace
                        if any(c.get("text") for c in data.get("choices", [])):
                            trace.token_times.append(time.monotonic())
                            chunks += 1
                        usage = data.get("usage") or usage
            except httpx.HTTPError as err:
                trace.error = f"{type(err).__name__}: {err}"
                return trace
            trace.done = time.monotonic()
            trace.tokens = usage["completion_tokens"] if usage else chunks
            if trace.token_times:
                trace.ttft_ms = (trace.token_times[0] - trace.sent) * 1000
            return trace

        async def chain(items: list[Arrival]) -> list[Trace]:
            return [await one(item) for item in items]

        singles, chained = await asyncio.gather(asyncio.gather(*(one(a) for a in arrivals)),
                                                asyncio.gather(*(chain(c) for c in chains)))
        traces = [*singles, *(t for c in chained for t in c)]
    end = max((t.done for t in traces if t.done is not None), default=time.monotonic())
    return list(traces), end - min(t.sent for t in traces)


class Stoppable(Protocol):
    """A server a peer owns: ``ServerProcess`` or our ``LocalServer``."""

    @property
    def pid(self) -> int | None: ...

    def stop(self) -> None: ...


class CompletionsPeer(Contender):
    """An OpenAI-compatible server driven by ``stream_completions``; owns its process, if any."""

    def __init__(self, name: str, label: str, base_url: str, model: str, *, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None, process: Stoppable | None = None) -> None:
        self.name, self.label = name, label
        self.base_url, self.model, self.headers, self.extra = base_url, model, headers, extra
        self.process = process

    def supports(self, workload: Workload) -> bool:
        return workload.late is None

    def pids(self) -> list[int]:
        pid = self.process.pid if self.process is not None else None
        return [pid] if pid else []

    def run(self, workload: Workload) -> Run:
        traces, wall = asyncio.run(stream_completions(self.base_url, self.model, workload.arrivals,
                                                      chains=workload.chains,
                                                      headers=self.headers, extra=self.extra))
        failed = [t.error for t in traces if t.error]
        if failed:
            raise RuntimeError(f"{self.label}: {len(failed)} requests failed: {failed[:3]}")
        return Run(wall, sum(t.tokens for t in traces), [t.ttft_ms for t in traces],
                   [t.latency_ms for t in traces])

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
