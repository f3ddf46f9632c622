"""Speculative decoding in the decode step: draft tokens proposed per row, verified in the same
forward as everyone's next token.

A row that speculates (nothing to shape, no log probabilities asked) feeds its last token and
its draft tokens (``ngram.propose``: what followed its latest tokens earlier in its prompt or
answer); one forward gives the logits after each of them. A greedy row keeps its drafts up to
the first one its model disagrees with, and its model's own token after those: exactly the
tokens it would have got one a step, several at once where the guesses were right. A sampled
row keeps each draft with the probability its model gives it, and at the first it refuses
draws from the model's distribution without that token (rejection sampling, Leviathan et al.
2023, with a draft that is one token for sure): its tokens follow the model's distribution
exactly. A row with a seed does not speculate: its tokens would then depend on whether its
batch mates let it (``max_rows``), and a seeded request gets the same tokens in any batch.
The KV of the rejected drafts goes (``HFBatch.advance_verified``).

How many a row proposes, and when it sits out, follows its acceptance (``guessing.py``).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from . import ragged
from .base import Sampled
from .guessing import STEP_DRAFT_TOKENS, Guessing, after_verify, sit_out
from .ngram import propose
from .sampling import RowSampler, filter_logits, sample

if TYPE_CHECKING:
    from ..values.sequence import Sequence
    from .draft_model import DraftModel
    from .hf_batch import HFBatch


def drafts(buckets: Seq[HFBatch], seqs: Seq[Sequence], most: int, max_rows: int,
           draft_model: DraftModel | None = None) -> dict[str, list[int]]:
    """Each speculating row's draft tokens, by row id (rows without a guess are not named):
    at most ``most`` (its ``draft_k`` if lower), no more than it may still generate after one;
    from ``draft_model`` if given, else by prompt lookup (``ngram.propose``)."""
    by_id = {s.id: s for s in seqs}
    if draft_model is not None:
        draft_model.keep(set(by_id))  # rows that left free their draft KV
    if not most or not seqs or len(seqs) > max_rows:
        return {}
    most = min(most, max(1, STEP_DRAFT_TOKENS // len(seqs)))
    out = {}
    for bucket in buckets:
        for row_id, sampler in zip(bucket.ids, bucket.samplers, strict=True):
            params = sampler.params
            if sampler.processors or params.logprobs is not None or row_id in bucket.forced or \
                    (not params.greedy and params.seed is not None):
                continue
            seq = by_id[row_id]
            # Tokens it may still get, known on the host (the service resolved max_tokens).
            room = (seq.params.max_tokens or 0) - len(seq.output_ids)
            state = bucket.draft_k.get(row_id) or Guessing(most)
            k = min(state.k, most, room - 1)
            if k <= 0:
                continue
            history = [*seq.prompt_ids, *seq.output_ids]  # one copy, for the lookup and the paper guess
            if state.wait:
                bucket.draft_k[row_id], back = sit_out(state, history, draft_model is None)
                if not back:
                    continue
            guess = draft_model.propose(row_id, history, k) if draft_model is not None else propose(history, k)
            if guess:
                out[row_id] = guess
    return out


def verify(logits: torch.Tensor, blocks: Seq[ragged.Block], buckets: Seq[HFBatch], guesses: dict[str, list[int]],
           samplers: Seq[RowSampler], most: int) -> Sampled:
    """The step's tokens after a forward that fed ``guesses`` (``logits`` of every column,
    block after block): each guessing row's kept guesses and its model's token after them;
    every other row samples from its last column as usual. The buckets move on past what
    each row kept."""
    sampled = _sample_the_others(logits[ragged.last_columns(blocks)], samplers,
                                 [i for b in buckets for i in b.ids], guesses)
    columns, spans, start = [], [], 0  # the columns whose logits check each row's guesses
    for bucket, block in zip(buckets, blocks, strict=True):
        width = block.ids.shape[1]
        for i, row_id in enumerate(bucket.ids):
            if row_id in guesses:
                fed = len(guesses[row_id]) + 1
                first = start + i * width + width - fed
                spans.append((len(columns), fed))
                columns.extend(range(first, first + fed))
        start += block.tokens
    choices = logits[torch.tensor(columns, device=logits.device)].argmax(-1).tolist()
    proposed, accepted = [0] * len(samplers), [0] * len(samplers)
    row, span = 0, iter(spans)
    for bucket, block in zip(buckets, blocks, strict=True):
        rejected, feed = [], []
        for row_id in bucket.ids:
            guess = guesses.get(row_id)
            if guess is None:
                rejected.append(0)
                feed.append(sampled.tokens[row])
            else:
                at, fed = next(span)
                if samplers[row].params.greedy:
                    model = choices[at : at + fed]  # its own token after its last one, and after each guess
                    keep = next((j for j, (g, m) in enumerate(zip(guess, model, strict=False)) if g != m), len(guess))
                    model = model[: keep + 1]
                else:
                    model = accept_sampled(logits[torch.tensor(columns[at : at + fed], device=logits.device)],
                                           guess, samplers[row])
                keep = len(model) - 1
                sampled.tokens[row] = model
                proposed[row], accepted[row] = len(guess), keep
                rejected.append(len(guess) - keep)
                feed.append([model[-1]])
                bucket.draft_k[row_id] = after_verify(bucket.draft_k.get(row_id) or Guessing(most), len(guess), keep,
                                                      most)
            row += 1
        bucket.advance_verified(block, rejected, feed)
    sampled.proposed, sampled.accepted = proposed, accepted
    return sampled


def accept_sampled(row_logits: torch.Tensor, guess: list[int], sampler: RowSampler) -> list[int]:
    """A sampled row's tokens from the logits after its last token and each guess
    (``[len(guess) + 1, vocab]``): each guess kept with the probability its model gives it;
    at the first refused, a token from the model's distribution without the guess (what is
    left of it, renormalized); after them all, one from the model's last distribution."""
    params, generator, out = sampler.params, sampler.generator, []
    for j, token in enumerate(guess):
        probs = torch.softmax(filter_logits(row_logits[j].float(), params), dim=-1)
        if float(torch.rand((), generator=generator)) < float(probs[token]):
            out.append(token)
            continue
        probs[token] = 0.0
        return [*out, int(torch.multinomial(probs / probs.sum(), 1, generator=generator))]
    probs = torch.softmax(filter_logits(row_logits[len(guess)].float(), params), dim=-1)
    return [*out, int(torch.multinomial(probs, 1, generator=generator))]


def _sample_the_others(logits: torch.Tensor, samplers: Seq[RowSampler], ids: list[str],
                       guesses: dict[str, list[int]]) -> Sampled:
    """``sample`` over the rows without guesses (a guessing row's tokens come from ``verify``;
    its generator must not draw here); the guessing rows get a placeholder."""
    others = [i for i, row_id in enumerate(ids) if row_id not in guesses]
    part = sample(logits[others], [samplers[i] for i in others]) if others else Sampled([])
    tokens: list[list[int]] = [[] for _ in ids]
    for i, t in zip(others, part.tokens, strict=True):
        tokens[i] = t

    def spread(values: list | None, empty: object) -> list | None:
        if values is None:
            return None
        out = [empty] * len(ids)
        for i, v in zip(others, values, strict=True):
            out[i] = v
        return out

    return Sampled(tokens, spread(part.logprobs, None), None, None, spread(part.errors, None),
                   spread(part.forced, 0))
