"""Speculative decoding in the decode step: draft tokens proposed per row, verified in the same
forward as everyone's next token.

A row that speculates (greedy, nothing to shape, no log probabilities asked) feeds its last
token and its draft tokens (``ngram.propose``: what followed its latest tokens earlier in its
prompt or answer); one forward gives the logits after each of them. The row keeps its drafts
up to the first one its model disagrees with, and its model's own token after those: exactly
the tokens it would have got one a step, several at once where the guesses were right. The
KV of the rejected drafts goes (``HFBatch.advance_verified``). How many a row proposes
follows its acceptance: one more after a run fully accepted, back to what was accepted
otherwise. A step of many rows gains little from guesses (it is busy already), so past
``max_rows`` decoding rows nobody proposes.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from . import ragged
from .base import Sampled
from .ngram import propose
from .sampling import RowSampler, sample

if TYPE_CHECKING:
    from ..sequence import Sequence
    from .hf_batch import HFBatch


def drafts(buckets: Seq[HFBatch], seqs: Seq[Sequence], most: int, max_rows: int) -> dict[str, list[int]]:
    """Each speculating row's draft tokens, by row id (rows without a guess are not named):
    at most ``most`` (its ``draft_k`` if lower), no more than it may still generate after one."""
    if not most or len(seqs) > max_rows:
        return {}
    by_id = {s.id: s for s in seqs}
    out = {}
    for bucket in buckets:
        room = (bucket.ends - bucket.positions).tolist()
        for i, (row_id, sampler) in enumerate(zip(bucket.ids, bucket.samplers, strict=True)):
            if not sampler.plain or sampler.params.logprobs is not None or row_id in bucket.forced:
                continue
            seq = by_id[row_id]
            k = min(bucket.draft_k.get(row_id, most), room[i] - 1)
            guess = propose([*seq.prompt_ids, *seq.output_ids], k) if k > 0 else []
            if guess:
                out[row_id] = guess
    return out


def verify(logits: torch.Tensor, blocks: Seq[ragged.Block], buckets: Seq[HFBatch], guesses: dict[str, list[int]],
           samplers: Seq[RowSampler], most: int) -> Sampled:
    """The step's tokens after a forward that fed ``guesses`` (``logits`` of every column,
    block after block): each guessing row's kept guesses and its model's token after them;
    every other row samples from its last column as usual. The buckets move on past what
    each row kept."""
    sampled = sample(logits[ragged.last_columns(blocks)], samplers)
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
                model = choices[at : at + fed]  # its own token after its last one, and after each guess
                keep = next((j for j, (g, m) in enumerate(zip(guess, model, strict=False)) if g != m), len(guess))
                sampled.tokens[row] = model[: keep + 1]
                proposed[row], accepted[row] = len(guess), keep
                rejected.append(len(guess) - keep)
                feed.append([model[keep]])
                bucket.draft_k[row_id] = min(most, len(guess) + 1) if keep == len(guess) else max(1, keep)
            row += 1
        bucket.advance_verified(block, rejected, feed)
    sampled.proposed, sampled.accepted = proposed, accepted
    return sampled
