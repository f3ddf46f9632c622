"""The one small interface the engine loop drives, step by step, from its engine thread."""

from __future__ import annotations

import abc
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from ..request import TokenLogprob
    from ..sequence import Sequence


@dataclass
class EngineInfo:
    engine: str  # "hf" | "simulated" | "openai" | "router"
    model: str
    device: str
    dtype: str
    max_context: int  # prompt + generated tokens one row can hold
    fallback_reason: str | None = None
    details: dict = field(default_factory=dict)
    # Every model served, as v1/models cards ({"id", "route"}): a router's, one per backend.
    # Empty: just ``model``.
    models: list[dict[str, Any]] = field(default_factory=list)

    def model_names(self) -> list[str]:
        """The served model's name first, then the names a request may use for it (or, for
        a router, for any of its backends: their models and the backends' own names)."""
        names = [self.model, Path(self.model).name, "default"]
        for card in self.models:
            names += [card["id"], Path(card["id"]).name, card.get("route")]
        return list(dict.fromkeys(n for n in names if n))


@dataclass
class StepPlan:
    """What one engine step runs.

    ``prefill``: run the prompts of ``seqs`` (newcomers), sample their first token and join
    them to the running batch. ``decode``: one token for every running row; ``seqs`` are
    exactly the running rows, in the order they joined. ``keep``: the ids of the rows
    already in the batch that stay for this step, in order (rows not in it have left).
    ``chunk`` (a prefill of one long prompt, chunked): compute at most this many more of its
    prompt tokens; it yields a token, and joins the running batch, only with the last chunk.
    """

    step_id: int
    kind: Literal["prefill", "decode"]
    seqs: list[Sequence]
    keep: list[str] = field(default_factory=list)
    chunk: int = 0

    @property
    def num_tokens(self) -> int:
        if self.kind == "prefill":
            return sum(s.num_prompt_tokens for s in self.seqs)
        return len(self.seqs)


@dataclass
class Sampled:
    """One step's output: a token per row and, only for the rows whose request asks,
    log probabilities (``None`` when no row asked, so the common step carries nothing)."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None] | None = None  # per row: the chosen token's
    # per row of a prefill: every prompt position's (the first is None); None if not asked
    prompt_logprobs: list[list[TokenLogprob | None] | None] | None = None


class Batch(Protocol):
    """The running rows of an engine, as one value (TGI's ``CausalLMBatch``): the rows' ids
    and whatever per-row state the engine keeps (KV cache, sampling generators, ...)."""

    ids: list[str]

    def filter(self, ids: list[str]) -> Batch | None:
        """Keep only the rows in ``ids`` (in that order, a subsequence of ``self.ids``);
        ``None`` when none is left."""

    def concatenate(self, other: Batch) -> Batch:
        """The rows of ``self``, then those of ``other``."""


class Engine(abc.ABC):
    """A causal LM, stepped one plan at a time from the engine loop's single thread.

    An engine holds no running rows itself: ``prefill`` returns the newcomers' ``Batch`` and
    ``decode`` advances the one it is given, so the loop that owns the batch value is the
    one place that says which rows run. ``tokenize``/``detokenize`` may run on any thread.
    """

    info: EngineInfo
    eos_token_ids: frozenset[int]
    # The chunk size this engine prefers for long prompts; 0: it cannot prefill in chunks
    # (prefill_chunk is not implemented), and the scheduler never asks it to.
    prefill_chunk_tokens = 0
    # The most characters of input text that one token can stand for (the longest token of
    # the vocabulary), or None if no such bound is known. A text longer than
    # ``max_prompt_tokens * max_token_chars`` cannot fit: the service refuses it before
    # spending any time tokenizing it.
    max_token_chars: int | None = None

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, token_ids: Seq[int]) -> str: ...

    @property
    def vocab_size(self) -> int:
        """Token ids from 0 to ``vocab_size - 1`` are valid in a prompt or ``logit_bias``."""
        raise NotImplementedError

    @abc.abstractmethod
    def prefill(self, seqs: list[Sequence]) -> tuple[Sampled, Batch]:
        """Run the prompts of ``seqs``; their first tokens and the batch of their rows."""

    @abc.abstractmethod
    def decode(self, batch: Batch, seqs: list[Sequence]) -> Sampled:
        """One token for every row of ``batch`` (``seqs`` are its rows, in order)."""

    def step(self, plan: StepPlan, batch: Batch | None) -> tuple[Sampled, Batch | None]:
        """Run ``plan`` on the running ``batch``: one token per ``plan.seqs``, and the batch
        after the step. Rows that left are filtered out first."""
        if batch is not None and batch.ids != plan.keep:
            batch = batch.filter(plan.keep)
        if plan.kind == "prefill":
            sampled, newcomers = self.prefill(plan.seqs)
            return sampled, newcomers if batch is None else batch.concatenate(newcomers)
        if batch is None:
            raise RuntimeError("a decode step needs a running batch")
        return self.decode(batch, plan.seqs), batch

    def prefill_chunk(self, seq: Sequence, partial: Batch | None, budget: int) -> tuple[Sampled | None, Batch]:
        """Up to ``budget`` more prompt tokens of ``seq``, continuing ``partial`` (its row so
        far, or ``None``/another row's to start afresh): the row after it, and its first token
        once the whole prompt is in (``None`` before)."""
        raise NotImplementedError(f"{type(self).__name__} cannot prefill in chunks")

    def step_chunk(
        self, plan: StepPlan, batch: Batch | None, partial: Batch | None,
    ) -> tuple[Sampled, Batch | None, Batch | None]:
        """Run a ``chunk`` plan: the next chunk of ``plan.seqs[0]``'s prompt, continuing
        ``partial``. Returns the step's tokens (none until the prompt is complete), the
        running batch and the partial row; on the last chunk the row joins the batch (after
        the rows that left) and the partial is ``None``."""
        if batch is not None and batch.ids != plan.keep:
            batch = batch.filter(plan.keep)
        sampled, row = self.prefill_chunk(plan.seqs[0], partial, plan.chunk)
        if sampled is None:
            return Sampled([]), batch, row
        return sampled, row if batch is None else batch.concatenate(row), None

    def prefix_cache_stats(self) -> dict | None:
        """Hits, misses, reused tokens and memory of the prefix cache (``None``: this engine
        has no such thing)."""
        return None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """A chat as one prompt; engines with a chat template override this."""
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + "\nassistant:"
