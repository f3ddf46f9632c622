"""What crosses between the scheduler and the engine each step: the plan (which rows, how many
tokens each, who left, who parks or resumes), one output per row, and what the rows hold in KV
memory. Plain values, below both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request import TokenLogprob
    from .sequence import Sequence


@dataclass
class StepPlan:
    """What one engine step runs: ``num_scheduled[i]`` more tokens of each sequence in ``seqs``.

    The scheduler's one rule: a sequence's computed tokens (``num_computed``, their KV in the
    engine) catch up with its tokens. A row with no output yet is a *prompt row*: newcomers'
    whole prompts, or the next chunk of a long one (a row whose prompt completes samples its
    first token and joins the decoding rows); the others are *decoding rows*: each one's
    uncomputed tokens (its last one, or those a grammar forced after it), and a token each;
    when a step has any, they are every decoding row. A step may hold both (``kind``
    "mixed"): one forward where the engine can. ``finished``: the rows that left the engine's
    hands since the last plan (finished, cancelled, failed, sent back to the queue): their KV
    goes before the step runs. A plan with no ``seqs`` only frees those. A chunk's budget may
    pass its prompt's end (or a prefix-cache hit may cover part of it): the engine computes
    up to the end. The engine keeps its rows itself (vLLM's ``SchedulerOutput``): a plan
    names them by id and count, and gets one ``RowOutput`` per row back.
    """

    step_id: int
    seqs: list[Sequence]
    num_scheduled: list[int] = field(default_factory=list)  # default: all of each row's uncomputed tokens
    finished: list[str] = field(default_factory=list)
    # Fair share: decoding rows that sit out from this step on (their state kept aside), and
    # parked rows that rejoin the decoding rows (after them, in this order), before it runs.
    park: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    # Speculation, per row: the most draft tokens it may propose and have verified in this
    # step (the scheduler's policy, ``speculative/guessing.py``); empty: no row guesses.
    guesses: list[int] = field(default_factory=list)
    # Per row: a prompt row (no output yet). Fixed when planned.
    prompt: list[bool] = field(init=False, default_factory=list)
    # The prompt tokens of a prompt that continues or stops short of its end (chunked
    # prefill); 0 for whole prompts. Fixed when planned.
    chunk: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.prompt = [not s.output_ids for s in self.seqs]
        if not self.num_scheduled:
            # A decoding row catches up with its last tokens: one, or those a grammar forced.
            self.num_scheduled = [s.num_uncomputed for s in self.seqs]
        if any(p and (s.num_computed or n < s.num_uncomputed)
               for s, n, p in zip(self.seqs, self.num_scheduled, self.prompt, strict=True)):
            self.chunk = sum(n for n, p in zip(self.num_scheduled, self.prompt, strict=True) if p)

    @property
    def kind(self) -> str:
        """"prefill" (prompt rows only), "decode" (decoding rows only) or "mixed"; "release"
        for a plan that only frees the rows that left."""
        if not self.seqs:
            return "release"
        if all(self.prompt):
            return "prefill"
        return "mixed" if any(self.prompt) else "decode"

    @property
    def decoding(self) -> list[int]:
        """Where the decoding rows are in ``seqs``."""
        return [i for i, p in enumerate(self.prompt) if not p]

    @property
    def failure_loses_decoding(self) -> bool:
        """The rule for this step failing: where it ran decoding rows, every decoding row is
        lost (their batch may be half-updated: the engine drops it, the scheduler fails their
        requests); its prompt rows alone are the scheduler's to retry or fail."""
        return bool(self.decoding)


@dataclass
class RowOutput:
    """One row's output of a step: the tokens it yields, in order (one for a decode or a
    completed prompt; none for a prompt chunk that is not its last; several for a row whose
    grammar forced a run, or whose draft tokens its model kept) and, only where its request
    asks, their log probabilities. Adding something a step tells about a row is one field."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one per token, where the request asks
    # A completed prompt's own (the first is None), where the request asks
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # A prompt row still short of its prompt's end: its computed tokens after the step (a
    # prefix-cache hit counts); None once its prompt is complete
    computed: int | None = None
    error: str | None = None  # why this row failed this step (its grammar could not go on): it alone fails
    forced: int = 0  # how many of its tokens a grammar forced
    # Speculation: the draft tokens it proposed this step, and how many of them its model
    # agreed with (its first ``accepted`` tokens; their KV is computed)
    proposed: int = 0
    accepted: int = 0


# One step's output: a ``RowOutput`` per row of the plan, in its order (``Engine.execute``).
Sampled = list[RowOutput]


@dataclass(frozen=True)
class KVUsage:
    """What an engine's rows hold in KV memory now: the bytes allocated for their keys and
    values (padding and spare room included), the real tokens in them, and one token's
    keys and values over every layer. ``waste_ratio`` is 1.0 when each row costs what it
    holds. ``shared_tokens``: tokens of prompt prefixes held once for several rows (counted
    once in ``tokens_held``). ``state_bytes``: a hybrid model's recurrent states (a fixed size
    per row, not per token: outside ``bytes_held`` and its ratio)."""

    bytes_held: int
    tokens_held: int
    bytes_per_token: int
    shared_tokens: int = 0
    state_bytes: int = 0

    @property
    def waste_ratio(self) -> float | None:
        needed = self.tokens_held * self.bytes_per_token
        return self.bytes_held / needed if needed else None

    def to_json(self) -> dict[str, Any]:
        ratio = self.waste_ratio
        return {"bytes_held": self.bytes_held, "tokens_held": self.tokens_held,
                "bytes_per_token": self.bytes_per_token, "waste_ratio": None if ratio is None else round(ratio, 3),
                "shared_tokens": self.shared_tokens, "state_bytes": self.state_bytes}
