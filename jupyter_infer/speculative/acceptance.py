"""Which of a row's draft tokens it keeps, from its model's logits after its last token and
after each guess (one forward verified them all).

A greedy row keeps its drafts up to the first one its model disagrees with, and its model's
own token after those: exactly the tokens it would have got one a step, several at once where
the guesses were right. A sampled row keeps each draft with the probability its model gives
it, and at the first it refuses draws from the model's distribution without that token
(rejection sampling, Leviathan et al. 2023, with a draft that is one token for sure): its
tokens follow the model's distribution exactly. A row with a seed does not speculate
(``guessing``): its tokens would then depend on whether its batch mates let it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from ..decoding.sampling import RowSampler, filter_logits


def kept(guess: list[int], choices: Seq[int], row_logits: torch.Tensor, sampler: RowSampler) -> list[int]:
    """A row's tokens this step: the guesses it keeps and its model's token after them.
    ``choices``: its model's greedy token after its last token and after each guess;
    ``row_logits``: the logits they come from (``[len(guess) + 1, vocab]``)."""
    if sampler.params.greedy:
        return keep_greedy(guess, choices)
    return accept_sampled(row_logits, guess, sampler)


def keep_greedy(guess: Seq[int], choices: Seq[int]) -> list[int]:
    """The guesses up to the first that differs from its model's choice, then that choice."""
    keep = next((j for j, (g, m) in enumerate(zip(guess, choices, strict=False)) if g != m), len(guess))
    return list(choices[: keep + 1])


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
