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

Who guesses and how many is the scheduler's policy (``scheduler/guessing.py``: it follows each
row's acceptance); the engine proposes at most that many per row, and says what each kept.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from ...decoding.ngram import propose
from ...decoding.sampling import RowSampler, filter_logits, sample
from ..base import RowOutput, Sampled
from . import ragged

if TYPE_CHECKING:
    from ...values.sequence import Sequence
    from .batch import HFBatch
    from .draft_model import DraftModel
    from .row import Row


def drafts(buckets: Seq[HFBatch], seqs: Seq[Sequence], guesses: dict[str, int],
           draft_model: DraftModel | None = None) -> dict[str, list[int]]:
    """Each speculating row's draft tokens, by row id (rows without a guess are not named):
    at most ``guesses[id]`` (the scheduler's policy, ``scheduler/guessing.py``), from
    ``draft_model`` if given, else by prompt lookup (``ngram.propose``). A row whose logits
    its processors shape (a grammar, penalties, a bias) or that feeds a forced run proposes
    none (its next token is not its model's plain choice), nor a row that asks for logprobs
    (the kept guesses would carry none)."""
    by_id = {s.id: s for s in seqs}
    out = {}
    for row in (r for bucket in buckets for r in bucket.rows):
        k = guesses.get(row.id, 0)
        if k <= 0 or row.sampler.processors or row.feed or row.sampler.params.logprobs is not None:
            continue
        seq = by_id[row.id]
        history = [*seq.prompt_ids, *seq.output_ids]
        if draft_model is not None:
            row.draft = row.draft or draft_model.new_kv()
            guess = draft_model.propose(row.draft, history, k)
        else:
            guess = propose(history, k)
        if guess:
            out[row.id] = guess
    return out


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
                spans.append((len(columns), fed))
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
            at, fed = next(span)
            if row.sampler.params.greedy:
                model = choices[at : at + fed]  # its own token after its last one, and after each guess
                keep = next((j for j, (g, m) in enumerate(zip(guess, model, strict=False)) if g != m), len(guess))
                model = model[: keep + 1]
            else:
                model = accept_sampled(logits[torch.tensor(columns[at : at + fed], device=logits.device)],
                                       guess, row.sampler)
            keep = len(model) - 1
            output.tokens, output.proposed, output.accepted = model, len(guess), keep
            rejected.append(len(guess) - keep)
            feed.append([model[-1]])
        bucket.advance_verified(block, rejected, feed)
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


def _sample_the_others(logits: torch.Tensor, rows: Seq[Row], guesses: dict[str, list[int]]) -> Sampled:
    """``sample`` over the rows without guesses (a guessing row's tokens come from ``verify``;
    its generator must not draw here); the guessing rows get an empty output to fill."""
    others = [i for i, row in enumerate(rows) if row.id not in guesses]
    out = [RowOutput() for _ in rows]
    part = sample(logits[others], [rows[i].sampler for i in others]) if others else []
    for i, output in zip(others, part, strict=True):
        out[i] = output
    return out
