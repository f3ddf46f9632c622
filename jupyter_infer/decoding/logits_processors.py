"""What may change one row's logits before its token is chosen: ``logit_bias``, ``min_tokens``
and the penalties, one small class each, in vLLM's order.

A processor is per-row state: ``mask(logits)`` shapes that row's logits (a float copy the
sampler owns), ``advance(tokens)`` tells it the tokens the row chose, so it never re-reads the
row's history. Today a row keeps every token it chooses, or leaves; a step that verifies
drafts will advance by the tokens it accepts. A grammar matcher fits the same two calls. A
processor that has nothing more to do says ``spent``, and the row goes back to the batch's
shared ``argmax``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ..values.request import SamplingParams


class LogitsProcessor(Protocol):
    spent: bool  # it will never change a logit again

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Shape one row of logits (``[vocab]``, float, this row's own copy); may work in place."""

    def advance(self, tokens: Seq[int]) -> None:
        """The row chose these tokens (in order)."""


class LogitBias:
    spent = False

    def __init__(self, bias: Seq[tuple[int, float]]) -> None:
        self._bias = tuple(bias)
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        if self._tensors is None:  # built once, on the logits' device
            vocab = logits.shape[-1]
            pairs = [(t, b) for t, b in self._bias if t < vocab]
            self._tensors = (torch.tensor([t for t, _ in pairs], dtype=torch.long, device=logits.device),
                             torch.tensor([b for _, b in pairs], dtype=logits.dtype, device=logits.device))
        ids, bias = self._tensors
        return logits.index_add_(0, ids, bias)

    def advance(self, tokens: Seq[int]) -> None:
        pass


class MinTokens:
    """End-of-sequence tokens are masked until the row has ``min_tokens``."""

    def __init__(self, min_tokens: int, eos_ids: Iterable[int]) -> None:
        self._left = min_tokens
        self._eos = sorted(eos_ids)

    @property
    def spent(self) -> bool:
        return self._left <= 0 or not self._eos

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.spent:
            logits[[e for e in self._eos if e < logits.shape[-1]]] = float("-inf")
        return logits

    def advance(self, tokens: Seq[int]) -> None:
        self._left -= len(tokens)


class RepetitionPenalty:
    """vLLM's: the logit of every token seen in the prompt or output is divided by ``penalty``
    when positive, multiplied when negative."""

    spent = False

    def __init__(self, penalty: float, prompt_ids: Iterable[int]) -> None:
        self._penalty = penalty
        self._seen = set(prompt_ids)
        self._index: torch.Tensor | None = None  # the seen ids as a tensor, until one more is seen

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        if self._index is None:
            self._index = torch.tensor(sorted(t for t in self._seen if t < logits.shape[-1]), dtype=torch.long,
                                       device=logits.device)
        values = logits[self._index]
        logits[self._index] = torch.where(values > 0, values / self._penalty, values * self._penalty)
        return logits

    def advance(self, tokens: Seq[int]) -> None:
        if not self._seen.issuperset(tokens):
            self._seen.update(tokens)
            self._index = None


class FrequencyPresencePenalty:
    """OpenAI's: ``frequency`` per occurrence in the output, ``presence`` once (the prompt
    does not count)."""

    spent = False

    def __init__(self, frequency: float, presence: float) -> None:
        self._frequency, self._presence = frequency, presence
        self._counts: Counter[int] = Counter()

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        if self._counts:
            ids = torch.tensor(list(self._counts), dtype=torch.long, device=logits.device)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype, device=logits.device)
            logits[ids] -= self._frequency * counts + self._presence
        return logits

    def advance(self, tokens: Seq[int]) -> None:
        self._counts.update(tokens)


def processors_for(params: SamplingParams, prompt_ids: Seq[int], eos_ids: Iterable[int]) -> list[LogitsProcessor]:
    """The processors a request's parameters ask for, in vLLM's order (none for most)."""
    out: list[LogitsProcessor] = []
    if params.logit_bias:
        out.append(LogitBias(params.logit_bias))
    if params.min_tokens > 0:
        out.append(MinTokens(params.min_tokens, eos_ids))
    if params.repetition_penalty != 1.0:
        out.append(RepetitionPenalty(params.repetition_penalty, prompt_ids))
    if params.frequency_penalty or params.presence_penalty:
        out.append(FrequencyPresencePenalty(params.frequency_penalty, params.presence_penalty))
    return out
