"""Next-token choice for a batch of rows, each with its own ``RowSampler`` (parameters, RNG,
logits processors) held by the engine's batch.

The common row (no penalty, no bias, no logprobs) costs what it always did: greedy rows
share one ``argmax``, sampled rows one filtered softmax each. Only a row that asks for
more pays for it: its processors (``logits_processors.py``) shape that row's logits from
the state they keep, and log probabilities are computed for the rows that want them, in
one ``log_softmax`` over just those rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from ..constraints.grammar import Grammar, GrammarRow
from ..values.request import SamplingParams, TokenLogprob
from ..values.step import RowOutput, Sampled
from .logits_processors import LogitsProcessor, processors_for


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row of logits."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p; the first always stays
        # (top_p=0 is then greedy over the tempered logits, not an empty distribution).
        drop = probs.cumsum(dim=-1) - probs >= params.top_p
        drop[0] = False
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


@dataclass
class RowSampler:
    """One row's way of choosing tokens, held by the engine's batch beside the row's KV (and
    filtered and concatenated with it): its parameters, its RNG (``None`` for a greedy row)
    and its logits processors. Built at prefill; ``advance`` with each token it chose."""

    params: SamplingParams
    generator: torch.Generator | None = None
    processors: list[LogitsProcessor] = field(default_factory=list)
    eos: int | None = None  # what a constrained row appends once its grammar is complete

    @classmethod
    def build(
        cls, params: SamplingParams, prompt_ids: Seq[int], eos_ids: frozenset[int], device: str = "cpu",
        grammar: Grammar | None = None,
    ) -> RowSampler:
        """``grammar``: the row's constraint, compiled; its matcher masks last."""
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=device)
            if params.seed is not None:
                generator.manual_seed(params.seed)
            else:
                generator.seed()
        processors = processors_for(params, prompt_ids, eos_ids)
        if grammar is not None:
            processors.append(grammar.row())
        return cls(params, generator, processors, min(eos_ids) if eos_ids else None)

    def forced(self) -> list[int]:
        """The tokens its grammar allows no alternative to after the chosen one (not yet
        consumed); none for a row that asks for logprobs (every token it gets has its own)."""
        grammar = self.grammar
        if grammar is None or self.params.logprobs is not None:
            return []
        return grammar.forced()

    def fast_forward(self, run: list[int] | None = None) -> list[int]:
        """The tokens a constrained row appends without sampling after its chosen one: those
        its grammar allows no alternative to (``run``: a beginning of ``forced()``), then EOS
        once it is complete (so the row does not spend a step on either)."""
        grammar = self.grammar
        if grammar is None or self.params.logprobs is not None:
            return []
        run = grammar.fast_forward(self.eos, run)
        if run and len(self.processors) > 1:  # the penalties see the run too
            for processor in self.processors[:-1]:
                processor.advance(run)
            self.processors = [p for p in self.processors if not p.spent]
        return run

    @property
    def grammar(self) -> GrammarRow | None:
        last = self.processors[-1] if self.processors else None
        return last if isinstance(last, GrammarRow) else None

    @property
    def plain(self) -> bool:
        """Greedy with nothing to shape: the batch's shared ``argmax`` is its choice."""
        return self.params.greedy and not self.processors

    def shape(self, logits: torch.Tensor) -> torch.Tensor:
        """This row's logits (a float copy) after its processors."""
        row = logits.float().clone()
        for processor in self.processors:
            row = processor.mask(row)
        return row

    def choose(self, logits: torch.Tensor) -> int:
        """The token for one row of logits (not a plain row: those share the batch's argmax).
        A row whose grammar failed (its library's error state) gets EOS: it fails, alone."""
        if self.grammar is not None and self.grammar.error:
            return self.eos if self.eos is not None else 0
        shaped = self.shape(logits) if self.processors else logits.float()
        if self.params.greedy:
            return int(torch.argmax(shaped))
        if self.grammar is not None and int(torch.isfinite(shaped).sum()) == 1:
            # A token the grammar forces takes no draw: the row's generator moves as it does
            # when fast-forward appends the token, so a seed gives one answer either way.
            return int(torch.argmax(shaped))
        probs = torch.softmax(filter_logits(shaped, self.params), dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator).item())

    def advance(self, tokens: Seq[int]) -> None:
        for processor in self.processors:
            processor.advance(tokens)
        if any(p.spent for p in self.processors):  # min_tokens reached: nothing left to mask
            self.processors = [p for p in self.processors if not p.spent]


def grammar_rows(samplers: Iterable[RowSampler]) -> list[GrammarRow]:
    """The grammar states of the constrained rows (their masks are computed beside the forward)."""
    return [s.grammar for s in samplers if s.grammar is not None]


def sample(logits: torch.Tensor, samplers: Seq[RowSampler],
           width: Callable[[list[int]], int | None] | None = None) -> Sampled:
    """One token per row of ``logits`` (shape ``[rows, vocab]``; ``samplers`` are the rows').

    Greedy rows share one ``argmax``; sampled rows draw with their own generator so that a
    request with a seed gets the same tokens whatever batch it lands in. Each row's
    processors are advanced by its token; a constrained row may get more than one (its
    grammar's forced tokens, ``RowSampler.fast_forward``), as many as ``width`` (each row's
    tokens to feed next → the step width worth feeding; ``step_cost``) lets it: the rest of a
    run is forced again next step.
    """
    tokens = torch.argmax(logits, dim=-1).tolist()
    out = [RowOutput([t]) for t in tokens]
    runs: dict[int, list[int]] = {}
    for row, sampler in enumerate(samplers):
        if not sampler.plain:
            tokens[row] = sampler.choose(logits[row])
            out[row].tokens = [tokens[row]]
        if sampler.processors:
            sampler.advance((tokens[row],))
            runs[row] = sampler.forced()
    if runs:  # the rows with processors: a grammar's is the last
        wide = width([1 + len(runs.get(row, ())) for row in range(len(samplers))]) if width else None
        for row, run in runs.items():
            more = samplers[row].fast_forward(run if wide is None else run[: wide - 1])
            out[row].tokens += more
            out[row].forced = len(more)
            grammar = samplers[row].grammar
            if grammar is not None:
                out[row].error = grammar.error
    asking = [i for i, s in enumerate(samplers) if s.params.logprobs is not None]
    if asking:
        records = logprob_records(
            logits[asking], [tokens[i] for i in asking], [samplers[i].params.logprobs for i in asking]
        )
        for i, record in zip(asking, records, strict=True):
            out[i].logprobs = [record]
    return out


def logprob_records(logits: torch.Tensor, chosen: Seq[int], ks: Seq[int]) -> list[TokenLogprob]:
    """For each row of ``logits`` (``[n, vocab]``): the log probability of ``chosen[i]`` and
    the ``ks[i]`` most likely tokens, under the raw (unshaped) distribution."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(chosen, dtype=torch.long, device=lp.device)[:, None]
    chosen_lp = lp.gather(1, index).squeeze(1).tolist()
    k = max(ks)
    top_ids: list[list[int]] = [[] for _ in chosen]
    top_lp: list[list[float]] = [[] for _ in chosen]
    if k:
        values, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)
        top_ids, top_lp = ids.tolist(), values.tolist()
    return [
        TokenLogprob(int(token), value, tuple(zip(top_ids[i][: ks[i]], top_lp[i][: ks[i]], strict=True)))
        for i, (token, value) in enumerate(zip(chosen, chosen_lp, strict=True))
    ]


def prompt_logprobs(logits: torch.Tensor, prompt_ids: Seq[int], k: int) -> list[TokenLogprob | None]:
    """The prompt's own log probabilities: ``logits`` ``[len(prompt), vocab]`` are the
    model's outputs at the prompt positions (row ``j`` predicts token ``j + 1``); the first
    token has none."""
    if len(prompt_ids) < 2:
        return [None] * len(prompt_ids)
    records = logprob_records(logits[:-1], prompt_ids[1:], [k] * (len(prompt_ids) - 1))
    return [None, *records]
