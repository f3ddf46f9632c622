"""The one small interface the engine loop drives, step by step, from its engine thread:
``execute(plan)``, one output per row. The engine owns its running rows (``RowTable``), as
vLLM's runner keeps its ``InputBatch``: the plan names them by id, sends a new row's request
once, says which left and which park or resume, and nothing of them crosses back."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..values.engine_info import EngineInfo
from ..values.step import KVUsage, RowOutput, RowRequest, Sampled, StepPlan

if TYPE_CHECKING:
    from ..constraints.grammar import GrammarCompiler
    from ..cpu.cpu_share import CpuShare
    from ..text.model_text import ModelText

__all__ = ["Batch", "Engine", "HeldRows", "KVUsage", "RowOutput", "RowRequest", "RowTable", "Sampled", "StepPlan"]


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


B = TypeVar("B", bound=Batch)  # an engine's decoding rows
P = TypeVar("P")  # what an engine keeps of a prompt part-way through its prefill


@dataclass(frozen=True)
class HeldRows:
    """The ids of the rows an engine holds, by where they are (``Engine.held_rows``): the
    decoding rows in the engine's order, the prompts part-way through their prefill, the
    parked rows."""

    decoding: list[str]
    prefilling: list[str]
    parked: list[str]

    @property
    def ids(self) -> list[str]:
        return self.decoding + self.prefilling + self.parked


@dataclass
class RowTable(Generic[B, P]):
    """The rows an engine holds between steps, by request id: the decoding rows as one
    ``Batch`` (``B``: the engine's own), the row of each prompt still being prefilled (``P``:
    what the engine keeps of it, its KV so far), each parked row (fair share: a decoding row
    sitting out, as a batch of its own), and each row's request, as its first plan sent it."""

    decoding: B | None = None
    prefilling: dict[str, P] = field(default_factory=dict)
    parked: dict[str, B] = field(default_factory=dict)
    requests: dict[str, RowRequest] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return self.held().ids

    def held(self) -> HeldRows:
        return HeldRows(self.decoding.ids if self.decoding is not None else [], list(self.prefilling),
                        list(self.parked))

    def drop(self, ids: list[str]) -> None:
        """The rows in ``ids`` left: their KV goes (an id the table does not hold is skipped)."""
        if not ids:
            return
        gone = set(ids)
        if self.decoding is not None and gone.intersection(self.decoding.ids):
            self.decoding = self.decoding.filter([i for i in self.decoding.ids if i not in gone])
        for row_id in gone:
            self.prefilling.pop(row_id, None)
            self.parked.pop(row_id, None)
            self.requests.pop(row_id, None)

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

    def join(self, newcomers: B | None) -> None:
        if newcomers is not None:
            self.decoding = newcomers if self.decoding is None else self.decoding.concatenate(newcomers)

    def clear(self) -> None:
        self.decoding, self.prefilling, self.parked, self.requests = None, {}, {}, {}


class Engine(abc.ABC):
    """A causal LM, stepped one plan at a time from the engine loop's single thread.

    ``execute(plan)`` is its one step call: it frees the rows the plan says left, parks and
    resumes, runs the plan's tokens and answers one ``RowOutput`` per row, in the plan's order.
    The rows themselves stay here (``rows``) from step to step; an engine computes them in
    ``prefill`` (prompt rows), ``decode`` (the decoding rows) and ``mixed`` (both).
    It runs token ids: its model's text side (tokenizer, chat template, tool format, reasoning,
    end of sequence) is ``text`` (``text/model_text.py``), which the loops and routes use.
    """

    info: EngineInfo
    text: ModelText  # what the model reads and writes as text (its EOS included)
    # The chunk size this engine prefers for long prompts; 0: it cannot continue a prompt's
    # row across steps, and the scheduler always schedules whole prompts.
    prefill_chunk_tokens = 0
    # The most tokens of a prompt alone one step computes (0: all): bounds a long prompt's memory.
    prefill_step_tokens = 0
    # Compiles the constraints of structured outputs for this engine's tokenizer (``None``:
    # this engine cannot constrain its answers, and such requests are refused).
    grammars: GrammarCompiler | None = None
    # Speculation (``configure_speculation``; the service's loop turns it on): where the
    # drafts come from ("off", "ngram", "draft"), most draft tokens a row proposes a step, and
    # the most decoding rows that still propose.
    speculative_method = "off"
    speculative_tokens = 0
    speculative_max_rows = 0
    # Whether ``mixed`` runs decoding rows and prompt tokens in one forward: the scheduler
    # then lets newcomers join every step instead of taking steps of their own.
    mixes_steps = False
    # Whether it computes embeddings (``embed``); a request for one is refused before the
    # queue where it does not. ``generates``: whether it writes answers (an encoder does not).
    embeds = False
    generates = True
    # The engine's threads beside other processes on the CPU (``cpu.cpu_share``); None: not
    # on a CPU, or nothing to choose.
    cpu_share: CpuShare | None = None

    @property
    def vocab_size(self) -> int:
        """Token ids from 0 to ``vocab_size - 1`` are valid in a prompt or ``logit_bias``."""
        raise NotImplementedError

    def __init__(self) -> None:
        self.rows: RowTable[Any, Any] = RowTable()  # the running rows, from one step to the next

    def held_rows(self) -> HeldRows:
        """The ids of the rows this engine holds now (decoding, part-way, parked)."""
        return self.rows.held()

    def drop_rows(self) -> None:
        """Every row goes, with its KV (the loop stopped: no step holds them any more)."""
        self.rows.clear()

    def execute(self, plan: StepPlan) -> Sampled:
        """Run ``plan``: the rows that left go, parked rows move, new rows' requests are kept,
        then the plan's tokens, one ``RowOutput`` per row of ``plan.ids`` (each row's tokens
        join its request's ``output_ids``). A step that fails leaves no half-updated row: the
        decoding rows it ran are dropped (the scheduler fails their requests)."""
        rows = self.rows
        rows.drop(plan.finished)
        rows.move(plan.park, plan.resume)
        if not plan.ids:
            return []
        rows.requests.update((r.id, r) for r in plan.new)
        started = time.perf_counter()
        try:
            sampled = self._run(plan)
        except Exception:
            if plan.failure_loses_decoding:
                rows.decoding = None  # a decode may have half-updated the batch: start clean
            raise
        for row_id, output in zip(plan.ids, sampled, strict=True):
            if output.embedding is not None:
                del rows.requests[row_id]  # an embedding ends here: no row of it stays
                continue
            rows.requests[row_id].output_ids += output.tokens
        if self.cpu_share is not None:  # here: the step's thread is the one whose team it sets
            self.cpu_share.after_step(time.perf_counter() - started)
        return sampled

    def _run(self, plan: StepPlan) -> Sampled:
        kept = self.rows.requests
        if any(r.request.embed for r in plan.new):  # an embedding is always new: it never stays
            return self._with_embeddings(plan, [i for i, p in enumerate(plan.prompt)
                                                if p and kept[plan.ids[i]].request.embed])
        prompts = [i for i, p in enumerate(plan.prompt) if p]
        new = ([kept[plan.ids[i]] for i in prompts], [plan.num_scheduled[i] for i in prompts])
        if not plan.decoding:
            return self.prefill(*new)
        held = self.rows.decoding.ids if self.rows.decoding is not None else []
        at = {plan.ids[i]: i for i in plan.decoding}
        # The batch's order is the engine's (length buckets; rows resumed while a prompt was
        # part-way): decode sees its rows in it, the answer comes in the plan's.
        order = [at.get(i, -1) for i in held]  # before the step: newcomers join the batch
        if len(order) != len(at) or -1 in order:
            raise RuntimeError(f"the plan's decoding rows {sorted(at)} are not the engine's {sorted(held)}")
        decoding = [kept[i] for i in held]
        guesses = {plan.ids[i]: k for i, k in enumerate(plan.guesses) if k}
        if prompts:
            order, sampled = order + prompts, self.mixed(decoding, *new, guesses)
        else:
            sampled = self.decode(decoding, guesses)
        out: Sampled = [RowOutput()] * len(plan.ids)
        for row, output in zip(order, sampled, strict=True):
            out[row] = output
        return out

    def _with_embeddings(self, plan: StepPlan, embedding: list[int]) -> Sampled:
        """A step with embedding rows: their vectors (``embed``, whole prompts, no KV kept),
        then the rest of the plan as any step; one output per row, in the plan's order."""
        kept = self.rows.requests
        rows = [kept[plan.ids[i]] for i in embedding]
        vectors = self.embed(rows)
        out: Sampled = [RowOutput()] * len(plan.ids)
        for i, vector in zip(embedding, vectors, strict=True):
            out[i] = RowOutput(embedding=vector)
        done = set(embedding)
        rest = [i for i in range(len(plan.ids)) if i not in done]
        if rest:
            sub = StepPlan(plan.step_id, [plan.ids[i] for i in rest], [plan.num_scheduled[i] for i in rest],
                           [plan.prompt[i] for i in rest], [r for r in plan.new if not r.request.embed],
                           guesses=[plan.guesses[i] for i in rest] if plan.guesses else [], chunk=plan.chunk)
            for i, output in zip(rest, self._run(sub), strict=True):
                out[i] = output
        return out

    def embed(self, rows: list[RowRequest]) -> list[list[float]]:
        """Embedding rows' vectors (``Request.embed``): each whole prompt run, pooled as the
        model's embeddings are (a causal LM: its last token's final hidden state) and
        normalized to length 1. Only where ``embeds``: the loop refuses them before the queue
        elsewhere."""
        raise NotImplementedError

    @abc.abstractmethod
    def prefill(self, seqs: list[RowRequest], num_scheduled: list[int]) -> Sampled:
        """Run ``num_scheduled[i]`` more prompt tokens of each of ``seqs`` (the prompt rows'
        requests), continuing the row in ``rows.prefilling`` where a prompt was begun. Rows
        whose prompt is now complete join the decoding rows; the others stay in
        ``rows.prefilling``."""

    @abc.abstractmethod
    def decode(self, seqs: list[RowRequest], guesses: dict[str, int] | None = None) -> Sampled:
        """The tokens of every decoding row (``seqs``: their requests, in ``rows.decoding``'s
        order). ``guesses``: the most draft tokens a row may propose, by id (rows not named
        propose none; an engine that cannot verify drafts ignores it)."""

    def mixed(
        self, decoding: list[RowRequest], seqs: list[RowRequest], num_scheduled: list[int],
        guesses: dict[str, int] | None = None,
    ) -> Sampled:
        """A step of both kinds: one ``RowOutput`` per row, ``decode(decoding, guesses)``'s for
        the decoding rows then ``prefill``'s for the prompt rows. Here one after the other; an
        engine that can runs both in one forward (and says so with ``mixes_steps``)."""
        return self.decode(decoding, guesses) + self.prefill(seqs, num_scheduled)

    def configure_speculation(self, method: str, tokens: int, max_rows: int) -> None:  # noqa: B027 - optional
        """Draft tokens verified in the decode step, from ``method`` ("ngram", "draft": the
        engine's draft model; "off"), at most ``tokens`` a row while at most ``max_rows`` rows
        decode (the scheduler reads these three back for its policy, ``speculative/guessing.py``);
        an engine that cannot verify drafts ignores it."""

    def close(self) -> None:  # noqa: B027 - optional
        """Finish what outlives the engine (the prefix cache's blocks on their way to disk):
        called once it serves no more."""

    def kv_usage(self) -> KVUsage | None:
        """What the running rows hold in KV memory (``None``: this engine keeps no KV)."""
        return None

    def prefix_cache_stats(self) -> dict | None:
        """Hits, misses, reused tokens and memory of the prefix cache (``None``: this engine
        has no such thing)."""
        return None
