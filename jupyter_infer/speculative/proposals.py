"""Which rows propose draft tokens in a step, and from where: the scheduler allows each row
at most so many (``guessing``); the engine asks here for each allowed row's guesses, from its
draft model if it has one, else by prompt lookup (``ngram``)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

from .ngram import propose

if TYPE_CHECKING:
    from ..decoding.sampling import RowSampler
    from ..values.step import RowRequest
    from .draft_model import DraftKV, DraftModel


class GuessingRow(Protocol):
    """What a proposal reads (and, for a draft model, keeps) of an engine's running row (the
    hf engine's ``Row``)."""

    id: str
    sampler: RowSampler  # its processors and parameters: whether its model's plain choice decides
    feed: list[int] | None  # a grammar's forced run to feed next step, if any
    draft: DraftKV | None  # the draft model's KV of its history, once it guessed


def drafts(rows: Iterable[GuessingRow], seqs: Seq[RowRequest], guesses: dict[str, int],
           draft_model: DraftModel | None = None) -> dict[str, list[int]]:
    """Each speculating row's draft tokens, by row id (rows without a guess are not named):
    at most ``guesses[id]`` (the scheduler's policy, ``guessing``), from ``draft_model`` if
    given, else by prompt lookup (``ngram.propose``). A row whose logits its processors shape
    (a grammar, penalties, a bias) or that feeds a forced run proposes none (its next token is
    not its model's plain choice), nor a row that asks for logprobs (the kept guesses would
    carry none)."""
    by_id = {s.id: s for s in seqs}
    out = {}
    for row in rows:
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
