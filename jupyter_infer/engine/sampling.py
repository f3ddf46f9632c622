"""Next-token choice for a batch of rows, each with its own sampling parameters and RNG.

The common row (no penalty, no bias, no logprobs) costs what it always did: greedy rows
share one ``argmax``, sampled rows one filtered softmax each. Only a row that asks for
more pays for it: penalties read that row's token history, ``logit_bias`` and
``min_tokens`` touch that row's logits, and log probabilities are computed for the rows
that want them, in one ``log_softmax`` over just those rows.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from ..request import TokenLogprob
from .base import Sampled

if TYPE_CHECKING:
    from ..request import SamplingParams
    from ..sequence import Sequence


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


def shape_logits(logits: torch.Tensor, seq: Sequence, eos_ids: frozenset[int]) -> torch.Tensor:
    """One row's logits (a float copy) after ``logit_bias``, ``min_tokens`` and the
    penalties, in vLLM's order."""
    p = seq.params
    row = logits.float().clone()
    vocab = row.shape[-1]
    if p.logit_bias:
        ids = torch.tensor([t for t, _ in p.logit_bias if t < vocab], dtype=torch.long, device=row.device)
        bias = torch.tensor([b for t, b in p.logit_bias if t < vocab], dtype=row.dtype, device=row.device)
        row.index_add_(0, ids, bias)
    if len(seq.output_ids) < p.min_tokens and eos_ids:
        row[[e for e in eos_ids if e < vocab]] = float("-inf")
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.prompt_ids) | set(seq.output_ids)), dtype=torch.long, device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and seq.output_ids:
        out = torch.tensor(seq.output_ids, dtype=torch.long, device=row.device)
        ids, counts = out.unique(return_counts=True)
        row[ids] -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty
    return row


def sample(
    logits: torch.Tensor, seqs: Seq[Sequence], generators: Seq[torch.Generator | None],
    eos_ids: frozenset[int] = frozenset(),
) -> Sampled:
    """One token per row of ``logits`` (shape ``[rows, vocab]``; ``seqs`` are the rows).

    Greedy rows share one ``argmax``; sampled rows draw with their own generator so that a
    request with a seed gets the same tokens whatever batch it lands in.
    """
    tokens = torch.argmax(logits, dim=-1).tolist()
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.greedy and not p.shapes_logits:
            continue
        shaped = shape_logits(logits[row], seq, eos_ids) if p.shapes_logits else logits[row].float()
        if p.greedy:
            tokens[row] = int(torch.argmax(shaped))
            continue
        probs = torch.softmax(filter_logits(shaped, p), dim=-1)
        tokens[row] = int(torch.multinomial(probs, 1, generator=generators[row]).item())
    asking = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    if not asking:
        return Sampled(tokens)
    records = logprob_records(
        logits[asking], [tokens[i] for i in asking], [seqs[i].params.logprobs for i in asking]
    )
    logprobs: list[TokenLogprob | None] = [None] * len(seqs)
    for i, record in zip(asking, records, strict=True):
        logprobs[i] = record
    return Sampled(tokens, logprobs)


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
