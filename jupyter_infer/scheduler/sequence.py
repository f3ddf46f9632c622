"""A request as the scheduler tracks it: status, tokens so far, and the text they make.

Plain data, like nano-vllm's ``Sequence``: the scheduler moves a sequence through
WAITING → RUNNING → FINISHED; the engine only reads ``id``, ``prompt_ids``, ``output_ids``
and ``params``. When things happened to it (queued, admitted, first token, finished, which
batches) is written once, on ``record``: metrics, events and the final result all read it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from ..metrics import RequestRecord
from ..request import Request, RequestResult, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request: Request, prompt_ids: list[int]) -> None:
        self.request = request
        self.id = request.id
        self.params: SamplingParams = request.params
        self.prompt_ids = prompt_ids
        self.output_ids: list[int] = []
        self.status = Status.WAITING
        self.cancelled = False
        self.alone = False  # prefill it on its own: a group prefill it was in failed
        self.record = RequestRecord(request.id, request.priority, len(prompt_ids), request.arrival)
        self.text = ""  # text released to the caller so far
        self._decoded = ""  # text of all output tokens (may hold back a stop-string prefix)
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def priority_key(self) -> tuple[int, int]:
        return (-self.request.priority, self.request.order)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finish_reason(self) -> str | None:
        return self.record.finish_reason

    @finish_reason.setter
    def finish_reason(self, value: str | None) -> None:
        self.record.finish_reason = value

    def result(self) -> RequestResult:
        """The answer of a finished sequence, as the caller sees it."""
        rec = self.record
        end = rec.finished_at if rec.finished_at is not None else rec.queued_at

        def ms(t: float | None) -> float | None:
            return None if t is None else (t - rec.queued_at) * 1000

        return RequestResult(
            id=self.id,
            text=self.text,
            finish_reason=rec.finish_reason or rec.outcome,
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=len(self.output_ids),
            batch_id=rec.batch_id,
            batch_size=rec.batch_size,
            queued_ms=ms(rec.admitted_at if rec.admitted_at is not None else end),
            ttft_ms=ms(rec.first_token_at),
            total_ms=ms(end),
            token_ids=tuple(self.output_ids),
        )

    def append(
        self, token_id: int, detokenize: Callable[[list[int]], str], eos_ids: frozenset[int], now: float,
    ) -> str:
        """Add one generated token; return the text fragment it releases to the caller.

        Sets ``finish_reason`` when this token ends the sequence (EOS, a stop sequence, or
        ``max_tokens``). Detokenization is incremental (TGI's prefix/read offsets) so that a
        token costs O(1) however long the output is, and a multi-byte character split over
        tokens is released only once complete.
        """
        if self.record.first_token_at is None:
            self.record.first_token_at = now
        if token_id in eos_ids:
            self.finish_reason = "stop"
            return self._release(final=True)
        self.output_ids.append(token_id)
        prefix = detokenize(self.output_ids[self._prefix_offset : self._read_offset])
        full = detokenize(self.output_ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._decoded += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.output_ids)
        for stop in self.params.stop:
            at = self._decoded.find(stop, max(0, len(self.text) - len(stop)))
            if at != -1:
                self._decoded = self._decoded[:at]
                self.finish_reason = "stop"
                return self._release(final=True)
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
            return self._release(final=True)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        end = len(self._decoded)
        if not final:
            # Hold back a tail that could still grow into a stop sequence.
            end -= _longest_stop_prefix(self._decoded, self.params.stop)
            # And a trailing CR: with an LF in the next fragment it is one line break, but as
            # two SSE fragments a reader would see two.
            if end > len(self.text) and self._decoded[end - 1] == "\r":
                end -= 1
        fragment = self._decoded[len(self.text) : end]
        self.text += fragment
        return fragment


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
