"""A request as the scheduler tracks it: status, tokens so far, and the text they make.

Plain data, like nano-vllm's ``Sequence``, below both the scheduler and the engine: the
scheduler moves a sequence through WAITING → RUNNING → FINISHED; the engine only reads it
(``id``, ``prompt_ids``, ``output_ids``, ``num_computed`` and what derives from them,
``params``, ``request.prompt``). ``num_computed``
counts the tokens whose KV the engine holds; each step catches it up with the tokens (the
whole prompt, a chunk of a long one, the last output token), so a sequence whose prompt is
not all computed yet is being prefilled. When things happened to it (queued, admitted, first token, finished, which
batches) is written once, on ``record``: metrics, events and the final result all read it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from ..errors import InferError
from .metrics import RequestRecord
from .request import Request, RequestResult, SamplingParams, TokenLogprob


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"  # admitted: being prefilled (num_computed short of the prompt) or decoding
    PARKED = "parked"  # admitted, decoding, sitting out while another owner has its row (fair share)
    FINISHED = "finished"


class Sequence:
    """``prompt_tokens`` counts a prompt that is not tokenized here (an upstream server's,
    estimated until it reports usage); by default it is ``len(prompt_ids)``."""

    def __init__(self, request: Request, prompt_ids: list[int], *, prompt_tokens: int | None = None) -> None:
        self.request = request
        self.id = request.id
        self.params: SamplingParams = request.params
        self.prompt_ids = prompt_ids
        self.output_ids: list[int] = []
        self.num_computed = 0  # tokens whose KV the engine holds
        self.status = Status.WAITING
        self.cancelled = False
        self.alone = False  # prefill it on its own: a group prefill it was in failed
        self.record = RequestRecord(
            request.id, request.priority, len(prompt_ids) if prompt_tokens is None else prompt_tokens,
            request.arrival, owner=request.owner,
        )
        if request.params.constraint is not None:
            self.record.constraint = request.params.constraint.kind
        # The compiled constraint of a structured answer (``constraints.grammar.Grammar``):
        # the engine gives the row its own matcher from it.
        self.grammar: Any = None
        self.failure: InferError | None = None  # why it failed, when that is not the engine's fault
        self.text = ""  # text released to the caller so far
        self._decoded = ""  # text of all output tokens (may hold back a stop-string prefix)
        self._prefix_offset = 0
        self._read_offset = 0
        # Only for requests that ask: one record per output token, and the prompt's.
        self.logprobs: list[TokenLogprob] | None = [] if self.params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self._logprobs_sent = 0
        self._prompt_logprobs_sent = False

    @property
    def priority_key(self) -> tuple[int, int]:
        return (-self.request.priority, self.request.order)

    @property
    def num_prompt_tokens(self) -> int:
        return self.record.prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose KV is not computed yet: the rest of the prompt while prefilling, then
        the last output token (the next step's input)."""
        return len(self.prompt_ids) + len(self.output_ids) - self.num_computed

    @property
    def prefilling(self) -> bool:
        """Admitted, with part of the prompt still to compute (a long prompt, in chunks)."""
        return self.status is Status.RUNNING and self.num_computed < len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far (an upstream's own count: ``upstream.upstream_sequence``)."""
        return len(self.output_ids)

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
            completion_tokens=self.num_output_tokens,
            batch_id=rec.batch_id,
            batch_size=rec.batch_size,
            queued_ms=ms(rec.admitted_at if rec.admitted_at is not None else end),
            ttft_ms=ms(rec.first_token_at),
            total_ms=ms(end),
            token_ids=tuple(self.output_ids),
            prompt_ids=tuple(self.prompt_ids),
            prompt_text=self.request.prompt,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
            prompt_logprobs=None if self.prompt_logprobs is None else tuple(self.prompt_logprobs),
            route=rec.route,
        )

    def take_logprobs(self) -> tuple[tuple[TokenLogprob, ...], tuple[TokenLogprob | None, ...] | None]:
        """The records not handed out yet: the output tokens' since the last call, and the
        prompt's (once)."""
        out: tuple[TokenLogprob, ...] = ()
        if self.logprobs is not None and self._logprobs_sent < len(self.logprobs):
            out = tuple(self.logprobs[self._logprobs_sent :])
            self._logprobs_sent = len(self.logprobs)
        prompt = None
        if self.prompt_logprobs is not None and not self._prompt_logprobs_sent:
            prompt, self._prompt_logprobs_sent = tuple(self.prompt_logprobs), True
        return out, prompt

    def append(
        self, token_id: int, detokenize: Callable[[list[int]], str], eos_ids: frozenset[int], now: float,
        logprob: TokenLogprob | None = None,
    ) -> str:
        """Add one generated token; return the text fragment it releases to the caller.

        Sets ``finish_reason`` when this token ends the sequence (EOS unless ``ignore_eos``
        or fewer than ``min_tokens`` yet, a stop sequence once ``min_tokens`` exist, or
        ``max_tokens``; ``max_tokens=0`` ends at once, without the token). Detokenization is
        incremental (TGI's prefix/read offsets) so that a token costs O(1) however long the
        output is, and a multi-byte character split over tokens is released only once complete.
        """
        if self.record.first_token_at is None:
            self.record.first_token_at = now
        params = self.params
        if params.max_tokens == 0:  # only the prompt was wanted (echo with logprobs)
            self.finish_reason = "length"
            return ""
        if token_id in eos_ids and not params.ignore_eos and len(self.output_ids) >= params.min_tokens:
            self.finish_reason = "stop"
            return self._release(final=True, detokenize=detokenize)
        self.output_ids.append(token_id)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        self._decode_tail(detokenize, final=False)
        for stop in self.params.stop if len(self.output_ids) >= params.min_tokens else ():
            at = self._decoded.find(stop, max(0, len(self.text) - len(stop)))
            if at != -1:
                self._decoded = self._decoded[:at]
                self.finish_reason = "stop"
                return self._release(final=True)
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
            return self._release(final=True, detokenize=detokenize)
        return self._release(final=False)

    def _decode_tail(self, detokenize: Callable[[list[int]], str], *, final: bool) -> None:
        """Decode the tokens after the read offset. A tail that ends inside a character (U+FFFD)
        waits for the next token, unless this is the end: then it is released as the tokenizer
        decodes it (vLLM does the same), or the answer's last characters would be lost."""
        prefix = detokenize(self.output_ids[self._prefix_offset : self._read_offset])
        full = detokenize(self.output_ids[self._prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            self._decoded += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.output_ids)

    def _release(self, final: bool, detokenize: Callable[[list[int]], str] | None = None) -> str:
        """The text not handed out yet that may go now. At the end (EOS, ``max_tokens``, but
        not a stop sequence, whose cut already fell) with ``detokenize``, a held-back tail of
        an incomplete character goes too."""
        if final and detokenize is not None and self._read_offset < len(self.output_ids):
            self._decode_tail(detokenize, final=True)
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
    """The longest tail of ``text`` that is a proper prefix of a stop sequence. It runs for
    every token on the event loop: only the places where a stop's first character occurs
    are tried (up to 64 stops of 256 characters each would otherwise cost milliseconds)."""
    longest = 0
    for stop in stops:
        at = text.find(stop[0], max(0, len(text) - len(stop) + 1))
        while at != -1 and len(text) - at > longest:
            if stop.startswith(text[at:]):
                longest = len(text) - at
                break
            at = text.find(stop[0], at + 1)
    return longest
