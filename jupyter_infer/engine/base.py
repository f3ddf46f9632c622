"""The one small interface the engine loop drives, step by step, from its engine thread."""

from __future__ import annotations

import abc
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..constraints.tool_formats import HERMES, ToolFormat
from ..values.engine_info import EngineInfo

if TYPE_CHECKING:
    from ..constraints.grammar import GrammarCompiler
    from ..values.request import TokenLogprob
    from ..values.sequence import Sequence


@dataclass
class StepPlan:
    """What one engine step runs: ``num_scheduled[i]`` more tokens of each sequence in ``seqs``.

    The scheduler's one rule: a sequence's computed tokens (``num_computed``, their KV in the
    engine) catch up with its tokens. A row with no output yet is a *prompt row*: newcomers'
    whole prompts, or the next chunk of a long one (a row whose prompt completes samples its
    first token and joins the decoding rows); the others are *decoding rows*: each one's
    uncomputed tokens (its last one, or those a grammar forced after it), and a token each;
    when a step has any, they are every decoding row. A step may hold both (``kind``
    "mixed"): one forward where the engine can (``Engine.mixed``). ``keep``: the ids of the
    rows already in the engine that stay (rows not in it have left, and their KV goes). A
    chunk's budget may pass its prompt's end (or a prefix-cache hit may cover part of it):
    the engine computes up to the end.
    """

    step_id: int
    seqs: list[Sequence]
    keep: list[str] = field(default_factory=list)
    num_scheduled: list[int] = field(default_factory=list)  # default: all of each row's uncomputed tokens
    # Fair share: decoding rows that sit out from this step on (their state kept aside), and
    # parked rows that rejoin the decoding rows (after them, in this order), before it runs.
    park: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    # Speculation, per row: the most draft tokens it may propose and have verified in this
    # step (the scheduler's policy, ``scheduler/guessing.py``); empty: no row guesses.
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
        """"prefill" (prompt rows only), "decode" (decoding rows only) or "mixed"."""
        if all(self.prompt):
            return "prefill"
        return "mixed" if any(self.prompt) else "decode"


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


# One step's output: a ``RowOutput`` per row (of the plan, from ``Engine.step``).
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


class Batch(Protocol):
    """The decoding rows of an engine, as one value (TGI's ``CausalLMBatch``): the rows' ids
    and whatever per-row state the engine keeps (KV cache, row samplers, ...)."""

    ids: list[str]

    def filter(self, ids: list[str]) -> Batch | None:
        """Keep only the rows in ``ids`` (in that order, a subsequence of ``self.ids``);
        ``None`` when none is left."""

    def take(self, ids: list[str]) -> Batch:
        """A new batch of the rows in ``ids`` (a subsequence of ``self.ids``); ``self`` unchanged."""

    def concatenate(self, other: Batch) -> Batch:
        """The rows of ``self``, then those of ``other``."""


@dataclass
class Rows:
    """All an engine holds for the loop between steps: the decoding rows as one ``Batch``,
    the row of each prompt still being prefilled (its KV so far), and each parked row (fair
    share: a decoding row sitting out, as a batch of its own), by request id."""

    decoding: Batch | None = None
    prefilling: dict[str, Any] = field(default_factory=dict)
    parked: dict[str, Batch] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return (self.decoding.ids if self.decoding is not None else []) + list(self.prefilling) + list(self.parked)

    def keep(self, ids: list[str]) -> Rows:
        """Only the rows in ``ids`` stay (the rest left: their KV is dropped)."""
        if self.ids == ids:
            return self
        wanted = set(ids)
        decoding = self.decoding
        if decoding is not None:
            kept = [i for i in decoding.ids if i in wanted]
            decoding = decoding.filter(kept) if kept != decoding.ids else decoding
        return Rows(decoding, {i: row for i, row in self.prefilling.items() if i in wanted},
                    {i: row for i, row in self.parked.items() if i in wanted})

    def move(self, park: list[str], resume: list[str]) -> None:
        """Set the rows in ``park`` aside, and put those in ``resume`` back after the decoding rows."""
        if park:
            if self.decoding is None:
                raise RuntimeError("only decoding rows can be parked")
            for row_id in park:
                self.parked[row_id] = self.decoding.take([row_id])
            aside = set(park)
            self.decoding = self.decoding.filter([i for i in self.decoding.ids if i not in aside])
        for row_id in resume:
            self.join(self.parked.pop(row_id))

    def join(self, newcomers: Batch | None) -> None:
        if newcomers is not None:
            self.decoding = newcomers if self.decoding is None else self.decoding.concatenate(newcomers)


class Engine(abc.ABC):
    """A causal LM, stepped one plan at a time from the engine loop's single thread.

    An engine holds no running rows itself: ``step`` takes the loop's ``Rows`` and gives them
    back (``prefill`` returns the batch of the prompts it completed and the rows of those still
    part-way; ``decode`` advances the batch it is given), so the loop that owns the rows is
    the one place that says which rows run. ``tokenize``/``detokenize`` may run on any thread.
    """

    info: EngineInfo
    eos_token_ids: frozenset[int]
    # The chunk size this engine prefers for long prompts; 0: it cannot continue a prompt's
    # row across steps, and the scheduler always schedules whole prompts.
    prefill_chunk_tokens = 0
    # The most characters of input text that one token can stand for (the longest token of
    # the vocabulary), or None if no such bound is known. A text longer than
    # ``max_prompt_tokens * max_token_chars`` cannot fit: the service refuses it before
    # spending any time tokenizing it.
    max_token_chars: int | None = None
    # Compiles the constraints of structured outputs for this engine's tokenizer (``None``:
    # this engine cannot constrain its answers, and such requests are refused).
    grammars: GrammarCompiler | None = None
    # How this model writes tool calls, whether its chat template renders a request's tools
    # itself (``render_chat``'s ``tools``), and the format's marker as its special token.
    tool_format: ToolFormat = HERMES
    renders_tools = False
    tool_specials: dict[str, int] = {}  # noqa: RUF012 - never mutated; engines assign their own
    # Speculation (``configure_speculation``; the service's loop turns it on): where the
    # drafts come from ("off", "ngram", "draft"), most draft tokens a row proposes a step, and
    # the most decoding rows that still propose.
    speculative_method = "off"
    speculative_tokens = 0
    speculative_max_rows = 0
    # Whether ``mixed`` runs decoding rows and prompt tokens in one forward: the scheduler
    # then lets newcomers join every step instead of taking steps of their own.
    mixes_steps = False

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, token_ids: Seq[int]) -> str: ...

    @property
    def vocab_size(self) -> int:
        """Token ids from 0 to ``vocab_size - 1`` are valid in a prompt or ``logit_bias``."""
        raise NotImplementedError

    @abc.abstractmethod
    def prefill(
        self, seqs: list[Sequence], num_scheduled: list[int], partial: dict[str, Any],
    ) -> tuple[Sampled, Batch | None, dict[str, Any]]:
        """Run ``num_scheduled[i]`` more prompt tokens of each of ``seqs``, continuing the
        rows in ``partial`` (by request id) where a prompt was begun. Returns the step's
        tokens, the batch of the rows whose prompt is now complete (``None``: none is), and
        the rows still short of their prompt's end."""

    @abc.abstractmethod
    def decode(self, batch: Batch, seqs: list[Sequence], guesses: dict[str, int] | None = None) -> Sampled:
        """The tokens of every row of ``batch`` (``seqs`` are its rows, in the batch's order:
        ``step`` hands them so, and answers in the plan's). ``guesses``: the most draft tokens
        a row may propose, by id (rows not named propose none; an engine that cannot verify
        drafts ignores it)."""

    def step(self, plan: StepPlan, rows: Rows | None) -> tuple[Sampled, Rows]:
        """Run ``plan`` on the engine's ``rows``: the plan's tokens, and the rows after the
        step. Rows that left are dropped first."""
        rows = (rows or Rows()).keep(plan.keep)
        rows.move(plan.park, plan.resume)
        prompts = [i for i, p in enumerate(plan.prompt) if p]
        new = ([plan.seqs[i] for i in prompts], [plan.num_scheduled[i] for i in prompts], rows.prefilling)
        if len(prompts) == len(plan.seqs):
            sampled, complete, rows.prefilling = self.prefill(*new)
            rows.join(complete)
            return sampled, rows
        batch = rows.decoding
        if batch is None:
            raise RuntimeError("a step with decoding rows needs decoding rows")
        # The batch's order is the engine's (length buckets; rows resumed while a prompt was
        # part-way): decode sees its rows in it, the answer comes in the plan's.
        at = {s.id: i for i, s in enumerate(plan.seqs)}
        order = [at[i] for i in batch.ids]  # before the step: newcomers join the batch
        decoding = [plan.seqs[i] for i in order]
        guesses = {plan.seqs[i].id: k for i, k in enumerate(plan.guesses) if k}
        if not prompts:
            parts = [(order, self.decode(batch, decoding, guesses))]
        else:
            decoded, (sampled, complete, rows.prefilling) = self.mixed(batch, decoding, *new, guesses)
            rows.join(complete)
            parts = [(order, decoded), (prompts, sampled)]
        out: Sampled = [RowOutput()] * len(plan.seqs)
        for where, part in parts:
            for row, output in zip(where, part, strict=True):
                out[row] = output
        return out, rows

    def mixed(
        self, batch: Batch, decoding: list[Sequence], seqs: list[Sequence], num_scheduled: list[int],
        partial: dict[str, Any], guesses: dict[str, int] | None = None,
    ) -> tuple[Sampled, tuple[Sampled, Batch | None, dict[str, Any]]]:
        """A step of both kinds: ``decode(batch, decoding, guesses)``'s tokens, and what
        ``prefill`` gives for the prompt rows. Here one after the other; an engine that can
        runs both in one forward (and says so with ``mixes_steps``)."""
        return self.decode(batch, decoding, guesses), self.prefill(seqs, num_scheduled, partial)

    def configure_speculation(self, method: str, tokens: int, max_rows: int) -> None:  # noqa: B027 - optional
        """Draft tokens verified in the decode step, from ``method`` ("ngram", "draft": the
        engine's draft model; "off"), at most ``tokens`` a row while at most ``max_rows`` rows
        decode (the scheduler reads these three back for its policy, ``scheduler/guessing.py``);
        an engine that cannot verify drafts ignores it."""

    def kv_usage(self, rows: Rows | None) -> KVUsage | None:
        """What ``rows`` hold in KV memory (``None``: this engine keeps no KV)."""
        return None

    def prefix_cache_stats(self) -> dict | None:
        """Hits, misses, reused tokens and memory of the prefix cache (``None``: this engine
        has no such thing)."""
        return None

    def render_chat(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """A chat as one prompt; engines with a chat template override this (and read
        ``template_kwargs``, and ``tools`` where ``renders_tools``)."""
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + "\nassistant:"
