"""Agent experiments: K async agents, each doing a few rounds of reflect → tool → synthesize,
all calling the model at the same time — then how those calls were batched, and how that
compares with making the same calls one at a time (faster or slower: ``compare_phrase``).

    run = await run_agents(client, agents=6, rounds=2)
    run.show(client)                                  # timeline, batches, summary
    savings = await run.compare_one_at_a_time(client, sample=6)

Each agent is a plain coroutine; the model calls of different agents overlap, so the server's
scheduler groups them into batches by itself. A *tool* is any ``async (query) -> str``.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.simulated.answers import compose_answer
from .client import Client, Completion

Tool = Callable[[str], Awaitable[str]]

DEFAULT_TOPICS = (
    "dynamic batching", "the KV cache", "speculative decoding", "quantization",
    "retrieval-augmented generation", "mixture of experts", "tokenization", "embeddings",
)


def search_tool(latency_s: float = 0.05) -> Tool:
    """An offline stand-in for a search tool: a short, deterministic note after ``latency_s``."""

    async def search(query: str) -> str:
        await asyncio.sleep(latency_s)
        return compose_answer(query, seed=7).split(". ")[0] + "."

    return search


@dataclass
class AgentCall:
    """One model call of one agent."""

    agent: int
    round: int
    step: str  # "reflect" | "synthesize"
    prompt: str
    params: dict[str, Any]
    completion: Completion

    @property
    def label(self) -> str:
        return f"agent {self.agent} · r{self.round} · {self.step}"


def compare_phrase(batched_s: float, one_at_a_time_s: float) -> str:
    """Batched against one at a time, phrased the way it came out: ``"1.8× faster, 12.30 s
    saved"``, ``"2.5× slower, 21.75 s lost"`` or ``"about as fast (within 5%)"``; the ratio is
    always ≥ 1 and the seconds never negative."""
    if not (batched_s > 0 and one_at_a_time_s > 0):
        return "nothing to compare (no timed calls)"
    faster = one_at_a_time_s >= batched_s
    ratio = one_at_a_time_s / batched_s if faster else batched_s / one_at_a_time_s
    if f"{ratio:.1f}" == "1.0":
        return "about as fast (within 5%)"
    gap = abs(one_at_a_time_s - batched_s)
    return f"{ratio:.1f}× faster, {gap:.2f} s saved" if faster else f"{ratio:.1f}× slower, {gap:.2f} s lost"


@dataclass
class Savings:
    """Batched vs one at a time, for the model calls of one run (seconds)."""

    calls: int
    measured_calls: int  # replayed one at a time; the rest extrapolated by tokens
    batched_s: float  # wall time with at least one model call in flight
    one_at_a_time_s: float  # the same calls, each alone, back to back
    tool_s: float  # time spent in tools, the same either way
    mean_batch_size: float
    longest_wait_s: float = 0.0  # the longest a batched call waited in the server's queue

    @property
    def speedup(self) -> float:
        """One at a time ÷ batched: above 1 batching paid, below 1 it cost time."""
        return self.one_at_a_time_s / self.batched_s if self.batched_s else float("nan")

    def why_not(self) -> str:
        """When batching came out slower: the likeliest reason, from what was measured."""
        if self.mean_batch_size < 1.5:
            return (f"the calls hardly overlapped (mean batch size {self.mean_batch_size:.2f}), "
                    "so there was little to batch")
        if self.longest_wait_s > 0.25 * self.batched_s:
            return (f"batched calls waited up to {self.longest_wait_s:.2f} s in the queue before they "
                    "ran: an engine still loading or a busy server, not batching; "
                    "`await client.await_ready()` and an untimed warm-up run first")
        return ("a step with many rows cost more than the steps it replaced (on a CPU with few cores "
                "the work of a step grows with the batch), or the machine was busy: run it again")

    def verdict(self) -> str:
        """``compare_phrase``, with the likeliest reason when batching came out slower."""
        phrase = compare_phrase(self.batched_s, self.one_at_a_time_s)
        if self.batched_s > 0 and self.one_at_a_time_s > 0 and phrase.endswith(" lost"):
            phrase += f" (batching did not pay here: {self.why_not()})"
        return phrase

    def __str__(self) -> str:
        how = "measured" if self.measured_calls == self.calls else (
            f"measured on {self.measured_calls} of {self.calls} calls, extrapolated by tokens")
        return (
            f"{self.calls} model calls, mean batch size {self.mean_batch_size:.2f}: "
            f"{self.batched_s:.2f} s batched vs {self.one_at_a_time_s:.2f} s one at a time "
            f"({how}) — batched was {self.verdict()}"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return f"<p><b>Batched vs one at a time:</b> {html.escape(str(self))}</p>"


@dataclass
class AgentRun:
    """What ``run_agents`` did: every call, the agents' final notes, and the times."""

    calls: list[AgentCall] = field(default_factory=list)
    answers: dict[int, str] = field(default_factory=dict)
    tool_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def ids(self) -> list[str]:
        return [c.completion.id for c in self.calls if c.completion.id]

    @property
    def labels(self) -> dict[str, str]:
        return {c.completion.id: c.label for c in self.calls if c.completion.id}

    def batches(self) -> list[dict[str, Any]]:
        """Calls grouped by the batch they were admitted into, with its size."""
        groups: dict[int, dict[str, Any]] = {}
        for call in self.calls:
            bid = call.completion.batch_id
            if bid is None:
                continue
            group = groups.setdefault(bid, {"batch_id": bid, "size": call.completion.batch_size, "calls": []})
            group["size"] = max(group["size"], call.completion.batch_size)
            group["calls"].append(call.label)
        return [groups[k] for k in sorted(groups)]

    def mean_batch_size(self) -> float:
        """Mean size of the batch each call was admitted into."""
        sizes = [c.completion.batch_size for c in self.calls if c.completion.batch_size]
        return sum(sizes) / len(sizes) if sizes else 0.0

    def model_busy_s(self) -> float:
        """Wall time during which at least one model call was in flight."""
        spans = sorted((c.completion.sent_at, c.completion.received_at) for c in self.calls
                       if c.completion.sent_at and c.completion.received_at)
        total, end = 0.0, None
        for start, stop in spans:
            if end is None or start > end:
                total += stop - start
                end = stop
            elif stop > end:
                total += stop - end
                end = stop
        return total

    async def compare_one_at_a_time(self, client: Client, sample: int | None = None) -> Savings:
        """Replay the calls one at a time (all, or ``sample`` of them spread over the run) and
        compare with the batched run. The replay runs on an engine the batched run has already
        warmed up: time the batched run on a ready, warm engine too (``run_agents`` waits for
        the engine to load; an untimed short run first warms it)."""
        all_ok = [c for c in self.calls if c.completion.ok]
        calls = all_ok
        if sample is not None and 0 < sample < len(all_ok):
            step = len(all_ok) / sample
            calls = [all_ok[int(i * step)] for i in range(sample)]
        solo_s, solo_tokens = 0.0, 0
        for call in calls:
            start = time.perf_counter()
            result = await client.agenerate(call.prompt, **call.params)
            solo_s += time.perf_counter() - start
            solo_tokens += max(result.completion_tokens, 1)
        if len(calls) < len(all_ok):
            tokens = sum(max(c.completion.completion_tokens, 1) for c in all_ok)
            solo_s = solo_s / solo_tokens * tokens
        waits = [c.completion.queued_ms or 0.0 for c in all_ok]
        return Savings(
            calls=len(all_ok), measured_calls=len(calls), batched_s=self.model_busy_s(),
            one_at_a_time_s=solo_s, tool_s=self.tool_s, mean_batch_size=self.mean_batch_size(),
            longest_wait_s=max(waits, default=0.0) / 1000.0,
        )

    def to_html(self) -> str:
        rows = "".join(
            f"<tr><td>#{g['batch_id']}</td><td>{g['size']}</td>"
            f"<td style='text-align:left'>{html.escape(', '.join(g['calls']))}</td></tr>"
            for g in self.batches()
        )
        return (
            f"<p>{self._headline()}.</p>"
            "<table><tr><th>batch</th><th>size</th><th style='text-align:left'>calls admitted together</th></tr>"
            f"{rows}</table>"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return self.to_html()

    def _headline(self) -> str:
        return (f"{len(self.calls)} model calls by {len(self.answers)} agents in {self.wall_s:.2f} s; "
                f"mean batch size at admission {self.mean_batch_size():.2f}")

    def __str__(self) -> str:
        lines = [self._headline()]
        lines += [f"  batch #{g['batch_id']} (size {g['size']}): {', '.join(g['calls'])}" for g in self.batches()]
        return "\n".join(lines)

    def timeline(self, client: Client) -> Any:
        """A ``RunView`` (batch timeline + summary) of this run's calls, one row per call."""
        from .widgets import RunView

        view = RunView(title="agent calls")
        for call in self.calls:
            key = call.completion.id or call.label
            view.track(key, call.label)
            view.record_completion(key, call.completion)
        view.refresh(client, limit=max(200, 8 * len(self.calls)))
        return view

    def show(self, client: Client) -> Any:
        """Display the calls grouped by batch, the timeline and the summary."""
        from IPython.display import HTML, display

        display(HTML(self.to_html()))
        view = self.timeline(client)
        display(view)
        return view


async def run_agents(
    client: Client,
    agents: int = 4,
    rounds: int = 2,
    *,
    topics: Sequence[str] | None = None,
    tools: Mapping[str, Tool] | None = None,
    thoughts: int = 1,
    max_tokens: int = 32,
    temperature: float = 0.0,
) -> AgentRun:
    """Run ``agents`` agents concurrently; each round: reflect (``thoughts`` model calls at
    once) → call the ``search`` tool → synthesize (one model call).

    It waits for the engine to be ready first, so a server still loading its engine does not
    count as the agents' time (calls sent meanwhile would wait in its queue)."""
    await client.await_ready()
    topics = list(topics or DEFAULT_TOPICS)
    tools = dict(tools or {"search": search_tool()})
    tool = next(iter(tools.values()))
    run = AgentRun(started_at=time.time())
    params = {"max_tokens": max_tokens, "temperature": temperature}
    lock = asyncio.Lock()

    async def call(agent: int, round_: int, step: str, prompt: str) -> Completion:
        completion = await client.agenerate(prompt, **params)
        async with lock:
            run.calls.append(AgentCall(agent, round_, step, prompt, params, completion))
        return completion

    async def agent(k: int) -> None:
        topic = topics[k % len(topics)]
        notes = ""
        for r in range(1, rounds + 1):
            reflections = await asyncio.gather(*(
                call(k, r, "reflect", f"Agent {k}, round {r}, thought {j + 1}: what should I look up "
                     f"next to explain {topic}? Notes so far: {notes[:160]}")
                for j in range(thoughts)
            ))
            started = time.perf_counter()
            found = await tool(f"{topic} {reflections[0].text[:60]}")
            run.tool_s += time.perf_counter() - started
            synthesis = await call(k, r, "synthesize",
                                   f"Synthesize what we know about {topic}: {found} {reflections[0].text[:120]}")
            notes = synthesis.text
        run.answers[k] = notes

    await asyncio.gather(*(agent(k) for k in range(agents)))
    run.finished_at = time.time()
    run.calls.sort(key=lambda c: (c.completion.sent_at or 0.0))
    return run
