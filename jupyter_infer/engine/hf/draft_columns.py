"""Speculation in the hf engine's decode step: draft tokens verified in the same forward as
everyone's next token, where they sit in its ragged blocks.

A row that speculates (``speculative.proposals``: nothing to shape, no log probabilities
asked) feeds its last token and its draft tokens, right-aligned in its bucket's block; one
forward gives the logits after each of them. Here: which columns of that forward check each
row's guesses, what each row keeps of them (``speculative.acceptance``), the other rows'
tokens from their last column, and each bucket moving past what its rows kept (the KV of the
rejected drafts goes: ``HFBatch.advance_verified``). This stays in the engine because it
reads the engine's own layout (a block's ``rows × width`` columns, left-padded); the rules it
applies are the ``speculative`` floor's.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from ...decoding.sampling import sample
from ...speculative import acceptance
from ..base import RowOutput, Sampled
from . import ragged

if TYPE_CHECKING:
    from .batch import HFBatch
    from .row import Row


def verify(logits: torch.Tensor, blocks: Seq[ragged.Block], buckets: Seq[HFBatch],
           guesses: dict[str, list[int]]) -> Sampled:
    """The step's tokens after a forward that fed ``guesses`` (``logits`` of every column,
    block after block): each guessing row's kept guesses and its model's token after them;
    every other row samples from its last column as usual. The buckets move on past what
    each row kept."""
    rows = [r for bucket in buckets for r in bucket.rows]
    sampled = _sample_the_others(logits[ragged.last_columns(blocks)], rows, guesses)
    columns, spans, start = [], [], 0  # the columns whose logits check each row's guesses
    for bucket, block in zip(buckets, blocks, strict=True):
        width = block.ids.shape[1]
        for i, row in enumerate(bucket.rows):
            if row.id in guesses:
                fed = len(guesses[row.id]) + 1
                first = start + i * width + width - fed
                spans.append((len(columns), first, fed))
                columns.extend(range(first, first + fed))
        start += block.tokens
    choices = logits[torch.tensor(columns, device=logits.device)].argmax(-1).tolist()
    at_row, span = 0, iter(spans)
    for bucket, block in zip(buckets, blocks, strict=True):
        rejected, feed = [], []
        for row in bucket.rows:
            guess, output = guesses.get(row.id), sampled[at_row]
            at_row += 1
            if guess is None:
                rejected.append(0)
                feed.append(output.tokens)
                continue
            at, first, fed = next(span)
            # its model's token after its last one, and after each guess
            model = acceptance.kept(guess, choices[at : at + fed], logits[first : first + fed], row.sampler)
            keep = len(model) - 1
            output.tokens, output.proposed, output.accepted = model, len(guess), keep
            rejected.append(len(guess) - keep)
            feed.append([model[-1]])
        bucket.advance_verified(block, rejected, feed)
    return sampled


def _sample_the_others(logits: torch.Tensor, rows: Seq[Row], guesses: dict[str, list[int]]) -> Sampled:
    """``sample`` over the rows without guesses (a guessing row's tokens come from ``verify``;
    its generator must not draw here); the guessing rows get an empty output to fill."""
    others = [i for i, row in enumerate(rows) if row.id not in guesses]
    out = [RowOutput() for _ in rows]
    part = sample(logits[others], [rows[i].sampler for i in others]) if others else []
    for i, output in zip(others, part, strict=True):
        out[i] = output
    return out
