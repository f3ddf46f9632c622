"""The benchmark's workloads: who asks for what, and when.

Every contender gets exactly the same prompts (same text, so the same token ids) and the
same number of new tokens per request; EOS is ignored everywhere, so token counts match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...kernel.client import arrival_times
from ...values.prompts import SAMPLE_PROMPTS
from ..loadgen import Arrival

MIXED_CYCLE = (8, 16, 32, 64)


@dataclass(frozen=True)
class Workload:
    """Who asks what, and when.

    ``arrivals`` arrive at their times. ``chains`` (agents): each chain's requests go one
    after the other, the next sent when the previous answer is complete. ``late`` (the
    interference workload): one more request, sent once every arrival has streamed
    ``late_after`` tokens.
    """

    name: str  # burst | mixed | open | http | agents | interference | lengths
    description: str
    arrivals: list[Arrival]
    chains: list[list[Arrival]] = field(default_factory=list)
    late: Arrival | None = None
    late_after: int = 0
    # Prompts new every round: the workload of round i (0: the warm-up). A server that keeps
    # what it saw across requests (llama-server's ngram-mod keeps its n-gram table: its second
    # round of the same prompts replays the first's answers, 3-7x faster) would otherwise be
    # timed on answers it has seen.
    fresh: Callable[[int], Workload] | None = field(default=None, compare=False, repr=False)

    def for_round(self, i: int) -> Workload:
        """The workload of round ``i`` (0: the warm-up): itself, or its ``fresh`` prompts."""
        return self.fresh(i) if self.fresh is not None else self

    @property
    def closed(self) -> bool:
        """Everyone arrives at once (a padded batch can serve it)."""
        return not self.chains and self.late is None and all(a.at == 0 for a in self.arrivals)

    @property
    def requests(self) -> list[Arrival]:
        """Every request of the workload, in the order they are sent (chains round by round)."""
        rounds = max(map(len, self.chains), default=0)
        chained = [chain[r] for r in range(rounds) for chain in self.chains if r < len(chain)]
        return self.arrivals + chained + ([self.late] if self.late else [])

    @property
    def total_tokens(self) -> int:
        return sum(a.max_tokens for a in self.requests)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "requests": len(self.requests),
            "new_tokens": [a.max_tokens for a in self.requests],
            "total_new_tokens": self.total_tokens,
            "arrivals_s": [a.at for a in self.arrivals],
        }


def bench_prompts(count_tokens: Callable[[str], int], n: int, target: int = 20, offset: int = 0) -> list[str]:
    """``n`` prompts of ``target-2 .. target+2`` tokens: runs of words from the sample prompts
    (``offset``: the runs of prompts ``offset`` to ``offset + n``)."""
    words = " ".join(SAMPLE_PROMPTS).split()
    prompts = []
    for i in range(n):
        want = target - 2 + i % 5
        start = ((i + offset) * 11) % len(words)
        text = ""
        for j in range(len(words)):
            candidate = (text + " " + words[(start + j) % len(words)]).strip()
            if count_tokens(candidate) > want:
                break
            text = candidate
        prompts.append(text)
    return prompts


def burst(count_tokens: Callable[[str], int], n: int = 16, new_tokens: int = 32) -> Workload:
    prompts = bench_prompts(count_tokens, n)
    return Workload(
        "burst", f"{n} requests at once, ~20-token prompts, {new_tokens} new tokens each",
        [Arrival(0.0, p, new_tokens) for p in prompts],
    )


def mixed(count_tokens: Callable[[str], int], n: int = 32, cycle: tuple[int, ...] = MIXED_CYCLE) -> Workload:
    prompts = bench_prompts(count_tokens, n)
    return Workload(
        "mixed", f"{n} requests at once, outputs cycling {'/'.join(map(str, cycle))} tokens",
        [Arrival(0.0, p, cycle[i % len(cycle)]) for i, p in enumerate(prompts)],
    )


def open_loop(count_tokens: Callable[[str], int], n: int, rate: float, new_tokens: int = 32, seed: int = 0) -> Workload:
    """Poisson arrivals at ``rate`` req/s (the same seeded arrival times for every contender)."""
    prompts = bench_prompts(count_tokens, n)
    arrivals = [Arrival(round(at, 6), p, new_tokens) for at, p in zip(arrival_times(n, rate, seed), prompts, strict=True)]
    return Workload(
        "open", f"{n} requests, Poisson arrivals at {rate:.2f} req/s (~70% of capacity), {new_tokens} new tokens each",
        arrivals,
    )


def over_http(base: Workload) -> Workload:
    return Workload("http", base.description + ", through the real server over HTTP + SSE", base.arrivals)


# -- agents and interference (issue 12) -----------------------------------------------------------
AGENT_SYSTEM = (
    "You are one agent in a team of research assistants working inside a Jupyter notebook for a "
    "data scientist. Every task comes in three rounds. In the reflect round you restate the "
    "question, list what you already know, name what you are unsure about, and decide which "
    "single tool call would help most. In the tool round you write exactly one tool call, on one "
    "line, as name(arguments), using only the tools below, and nothing else. In the synthesize "
    "round you read the tool result and answer the question in at most five sentences, citing "
    "the tool result where you use it, and saying plainly when the evidence is thin. Tools: "
    "search(query) returns the three most relevant passages from the team's notes on machine "
    "learning systems; calculator(expression) evaluates arithmetic exactly; notebook(cell) runs "
    "one Python cell in the user's kernel and returns its output; memory(key) returns what the "
    "team stored under that key. Rules: be brief; never invent a tool result; prefer numbers to "
    "adjectives; when two sources disagree, say so and give both; keep units; when a question "
    "is about performance, ask what was measured, on which machine, and how often. The team "
    "shares one inference server, so long prompts cost everyone: keep your answers short. "
)
AGENT_TASKS = (
    "How does continuous batching differ from dynamic batching for a chat service?",
    "Why does a KV cache make decoding cheaper, and what does it cost in memory?",
    "When is prefix caching worth its memory on a notebook server?",
    "What limits tokens per second on a two-core CPU?",
    "How should an agent framework share one model between eight agents?",
    "What does chunked prefill trade against time to first token?",
    "Why do greedy outputs of a batched engine equal unbatched ones?",
    "How would you measure inter-token latency fairly?",
)
AGENT_PHASES = ("reflect", "tool", "synthesize")
TOOL_RESULT = (
    "search returned: (1) batching amortizes weight reads over rows; (2) prefill is compute "
    "bound, decode is memory bound; (3) a cached prefix skips its prefill entirely."
)


def fit_text(text: str, count_tokens: Callable[[str], int], tokens: int) -> str:
    """``text`` repeated and cut at a word so that it has about ``tokens`` tokens (not more)."""
    words = text.split()
    out: list[str] = []
    while True:
        # Grow by whole runs of words, then by single words near the end.
        step = max(1, (tokens - count_tokens(" ".join(out))) // 2) if out else max(1, tokens // 2)
        grown = out + [words[(len(out) + i) % len(words)] for i in range(step)]
        if count_tokens(" ".join(grown)) > tokens:
            if step == 1:
                return " ".join(out)
            grown = out + [words[len(out) % len(words)]]
            if count_tokens(" ".join(grown)) > tokens:
                return " ".join(out)
        out = grown


def agents(count_tokens: Callable[[str], int], k: int = 8, system_tokens: int = 500,
           new_tokens: int = 32) -> Workload:
    """``k`` agents, three rounds each (reflect, tool, synthesize), sharing one system prompt.

    Each round's prompt is the system prompt plus the agent's history so far: its task, then
    each earlier round's answer (scripted here, ``new_tokens`` long, so that every contender
    gets exactly the same prompts), and after the tool round a tool result. The next round
    starts when the previous answer is complete.
    """
    system = fit_text(AGENT_SYSTEM, count_tokens, system_tokens)
    answer_words = " ".join(AGENT_TASKS)
    chains = []
    for agent in range(k):
        history = f"{system}\n\nAgent {agent + 1}. Task: {AGENT_TASKS[agent % len(AGENT_TASKS)]}"
        chain = []
        for r, phase in enumerate(AGENT_PHASES):
            prompt = f"{history}\n{phase.capitalize()}:"
            chain.append(Arrival(0.0, prompt, new_tokens))
            shift = answer_words.split()[(agent * 7 + r * 3) % 40 :]
            answer = fit_text(" ".join(shift), count_tokens, new_tokens)
            history = f"{prompt} {answer}"
            if phase == "tool":
                history += f"\nTool result: {TOOL_RESULT}"
        chains.append(chain)
    longest = max(count_tokens(c[-1].prompt) for c in chains)
    return Workload(
        "agents", f"{k} agents x {len(AGENT_PHASES)} rounds (reflect, tool, synthesize), a "
        f"{count_tokens(system)}-token shared system prompt, prompts up to {longest} tokens, "
        f"{new_tokens} new tokens each", [], chains=chains,
    )


def lengths(count_tokens: Callable[[str], int], shorts: int = 15, long_tokens: int = 900,
            new_tokens: int = 64) -> Workload:
    """Mixed lengths: one ``long_tokens``-token prompt beside ``shorts`` short ones, all at
    once, ``new_tokens`` each (a planner's long history among quick tool calls)."""
    long_prompt = fit_text(AGENT_SYSTEM + " " + " ".join(AGENT_TASKS), count_tokens, long_tokens)
    return Workload(
        "lengths", f"one {count_tokens(long_prompt)}-token prompt and {shorts} of ~20 tokens at once, "
        f"{new_tokens} new tokens each",
        [Arrival(0.0, long_prompt, new_tokens)] + [Arrival(0.0, p, new_tokens) for p in bench_prompts(count_tokens, shorts)],
    )


def interference(count_tokens: Callable[[str], int], streams: int = 4, stream_tokens: int = 64,
                 long_tokens: int = 800, after: int = 4) -> Workload:
    """``streams`` requests streaming, then one ``long_tokens``-token prompt (8 new tokens)
    once each of them has streamed ``after`` tokens."""
    prompts = bench_prompts(count_tokens, streams)
    long_prompt = fit_text(AGENT_SYSTEM + " " + " ".join(AGENT_TASKS), count_tokens, long_tokens)
    return Workload(
        "interference", f"{streams} streams of {stream_tokens} tokens, then a "
        f"{count_tokens(long_prompt)}-token prompt arrives (8 new tokens)",
        [Arrival(0.0, p, stream_tokens) for p in prompts],
        late=Arrival(0.0, long_prompt, 8), late_after=after,
    )


# Contexts an answer reuses (issue 20): code being edited, a document to extract from, a tool's
# result to summarize. Cut by whole lines to the workload's size.
COPY_CODE = '''\
def schedule(self, now: float) -> tuple[StepPlan | None, float | None]:
    """The next step, or (None, wake_at): nothing to run before wake_at."""
    cancelled = [s for s in self.running if s.cancelled]
    if cancelled:
        for seq in cancelled:
            self._retire(seq, "cancelled", now)
        self.recorder.left(self.running, now)
    in_engine = [s.id for s in self.running if s.num_computed]
    decoding = self.decoding
    prefill, wake_at = self._prefill_work(now, decoding)
    if prefill:
        self._decodes_since_prefill = 0
        budgets = [self._budget(s, bool(decoding)) for s in prefill]
        return StepPlan(next(self._step_ids), "prefill", prefill, in_engine, budgets), None
    if decoding:
        self._decodes_since_prefill += 1
        return StepPlan(next(self._step_ids), "decode", decoding, in_engine), None
    return None, wake_at


def _budget(self, seq: Sequence, streams: bool) -> int:
    """Prompt tokens to compute for seq this step: all that remain, or at most a chunk."""
    return self.chunk_tokens if streams and self._chunked(seq) else seq.num_uncomputed


def _admit(self, now: float) -> tuple[list[Sequence], float | None]:
    cfg = self.config
    if not self.waiting:
        return [], None
    if cfg.mode == "window" and self.running:
        return [], None
    if self.running and not self._may_join():
        return [], None
    newcomers = self._pick(self.max_batch_size - len(self.running))
    if not newcomers:
        return [], None
    admitted = set(map(id, newcomers))
    self.waiting = [s for s in self.waiting if id(s) not in admitted]
    for seq in newcomers:
        seq.status = Status.RUNNING
    self.running.extend(newcomers)
    self.recorder.admitted(newcomers, self.running, now)
    return newcomers, None
'''
COPY_RECORDS = "\n".join(
    f'{{"id": {i}, "name": "{n}", "role": "{r}", "team": "{t}", "started": "2026-0{1 + i % 9}-1{i % 10}", '
    f'"active": {str(i % 3 != 0).lower()}}}'
    for i, (n, r, t) in enumerate([("Ada", "engineer", "infra"), ("Grace", "admiral", "compilers"),
                                   ("Alan", "researcher", "theory"), ("Edsger", "professor", "systems"),
                                   ("Barbara", "architect", "languages"), ("Ken", "engineer", "unix"),
                                   ("Dennis", "engineer", "unix"), ("Margaret", "director", "software"),
                                   ("John", "scientist", "lisp"), ("Frances", "engineer", "compilers")] * 3)
)
COPY_TASKS = (
    (COPY_CODE, "Rewrite these functions with a docstring for every branch, keeping the code as it is:\n\n"),
    (COPY_RECORDS, "Extract the name and team of every active record, one JSON object per line:\n\n"),
    (None, "Summarize the text above, quoting its key sentences:\n\n"),
)


def fit_lines(text: str, count_tokens: Callable[[str], int], tokens: int, start: int = 0) -> str:
    """``text``'s lines from line ``start`` on, repeated if needed, up to about ``tokens``
    tokens (lines whole)."""
    lines, out = text.splitlines(), []
    while count_tokens("\n".join(out)) < tokens:
        out.append(lines[(start + len(out)) % len(lines)])
    return "\n".join(out[:-1] if len(out) > 1 else out)


def copy_heavy(count_tokens: Callable[[str], int], n: int = 6, context_tokens: tuple[int, int] = (300, 600),
               new_tokens: int = 96, document: str = "", variant: int = 0) -> list[Arrival]:
    """``n`` prompts whose answers reuse their context: a 300-600-token piece of code, of JSON
    records or of a ``document``, then what to do with it (``variant``: contexts that start
    ``5 * variant`` lines further on, so each variant's prompts are new)."""
    low, high = context_tokens
    out = []
    for i in range(n):
        context, task = COPY_TASKS[i % len(COPY_TASKS)]
        size = low + (high - low) * i // max(1, n - 1)
        body = fit_lines(context if context is not None else document, count_tokens, size, start=5 * variant)
        out.append(Arrival(0.0, body + "\n\n" + task, new_tokens))
    return out
