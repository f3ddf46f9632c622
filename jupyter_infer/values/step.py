"""What crosses between the scheduler and the engine each step: the plan (which rows by id, how
many tokens each, a new row's request once, who left, who parks or resumes), one output per
row, and what the rows hold in KV memory. Plain values, below both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request import Request, SamplingParams, TokenLogprob
    from .sequence import Sequence


@dataclass(eq=False)
class RowRequest:
    """What the engine knows of a row's request: sent once, in the plan that brings the row
    to the engine (vLLM's ``NewRequestData``), then named by id only. Its request (the
    parameters; the simulated engine reads the prompt and messages), its prompt's token ids,
    its compiled constraint (``grammar``: the row gets its own matcher from it) and the tokens
    the engine's steps gave it (``output_ids``, appended by ``Engine.execute``: the history a
    guess reads; a row whose answer ended inside a step's tokens leaves at the next plan)."""

    id: str
    request: Request
    prompt_ids: list[int]
    grammar: Any = None  # constraints.grammar.Grammar
    output_ids: list[int] = field(default_factory=list)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @classmethod
    def of(cls, seq: Sequence) -> RowRequest:
        return cls(seq.id, seq.request, seq.prompt_ids, seq.grammar)


@dataclass
class StepPlan:
    """What one engine step runs: ``num_scheduled[i]`` more tokens of each row in ``ids``.

    The scheduler's one rule: a sequence's computed tokens (``num_computed``, their KV in the
    engine) catch up with its tokens. A row with no output yet is a *prompt row* (``prompt``):
    newcomers' whole prompts, or the next chunk of a long one (a row whose prompt completes
    samples its first token and joins the decoding rows); the others are *decoding rows*:
    each one's uncomputed tokens (its last one, or those a grammar forced after it), and a
    token each; when a step has any, they are every decoding row. A step may hold both
    (``kind`` "mixed"): one forward where the engine can. ``finished``: the rows that left the
    engine's hands since the last plan (finished, cancelled, failed, sent back to the queue):
    their KV goes before the step runs. A plan with no rows only frees those. A chunk's budget
    may pass its prompt's end (or a prefix-cache hit may cover part of it): the engine computes
    up to the end. The engine keeps its rows itself (vLLM's ``SchedulerOutput``): a plan names
    them by id and count, sends a row's request once (``new``: the rows whose prompt has not
    begun), and gets one ``RowOutput`` per row back. ``StepPlan.of`` plans sequences.
    """

    step_id: int
    ids: list[str] = field(default_factory=list)
    num_scheduled: list[int] = field(default_factory=list)
    # Per row: a prompt row (no output yet).
    prompt: list[bool] = field(default_factory=list)
    # The rows new to the engine (prompt rows whose prompt has not begun): their requests.
    new: list[RowRequest] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    # Fair share: decoding rows that sit out from this step on (their state kept aside), and
    # parked rows that rejoin the decoding rows (after them, in this order), before it runs.
    park: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    # Speculation, per row: the most draft tokens it may propose and have verified in this
    # step (the scheduler's policy, ``speculative/guessing.py``); empty: no row guesses.
    guesses: list[int] = field(default_factory=list)
    # The prompt tokens of a prompt that continues or stops short of its end (chunked
    # prefill); 0 for whole prompts.
    chunk: int = 0

    @classmethod
    def of(cls, step_id: int, seqs: list[Sequence], num_scheduled: list[int] | None = None,
           **more: Any) -> StepPlan:
        """The plan of ``seqs``: ``num_scheduled`` tokens each (by default all of each one's
        uncomputed tokens: a decoding row, its last one or those a grammar forced)."""
        prompt = [not s.output_ids for s in seqs]
        if not num_scheduled:
            num_scheduled = [s.num_uncomputed for s in seqs]
        chunk = 0
        if any(p and (s.num_computed or n < s.num_uncomputed)
               for s, n, p in zip(seqs, num_scheduled, prompt, strict=True)):
            chunk = sum(n for n, p in zip(num_scheduled, prompt, strict=True) if p)
        new = [RowRequest.of(s) for s, p in zip(seqs, prompt, strict=True) if p and not s.num_computed]
        return cls(step_id, [s.id for s in seqs], list(num_scheduled), prompt, new, chunk=chunk, **more)

    @property
    def kind(self) -> str:
        """"prefill" (prompt rows only), "decode" (decoding rows only) or "mixed"; "release"
        for a plan that only frees the rows that left."""
        if not self.ids:
            return "release"
        if all(self.prompt):
            return "prefill"
        return "mixed" if any(self.prompt) else "decode"

    @property
    def decoding(self) -> list[int]:
        """Where the decoding rows are in ``ids``."""
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
    # An embedding row's (``Request.embed``) pooled, normalized vector: its prompt complete,
    # the row ends here, holding no KV.
    embedding: list[float] | None = None


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
