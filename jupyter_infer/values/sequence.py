"""A request as the scheduler tracks it: status, tokens so far, and the text they make.

Plain data, like nano-vllm's ``Sequence``, below both the scheduler and the engine: the
scheduler moves a sequence through WAITING → RUNNING → FINISHED, the answer stage
(``loops/answer_stage.py``) appends its tokens and text and sets its finish reason; the engine
never sees it: a plan names its row by id, and sends the engine what the row needs once
(``values/step.RowRequest``). ``num_computed`` counts the tokens whose KV the engine holds;
each step catches it up with the tokens (the whole prompt, a chunk of a long one, the last
output token), so a sequence whose prompt is not all computed yet is being prefilled.
When things happened to it (queued, admitted, first token, finished, which batches) is
written once, on ``record``: metrics, events and the final result all read it.
"""

from __future__ import annotations

import enum
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
        # The answer stage's state (loops/answer_stage.AnswerState): it appends the tokens,
        # decides when one ends the request, releases the text and reads it as reasoning,
        # content and tool calls.
        self.answer: Any = None
        # Only for requests that ask: one record per output token, and the prompt's.
        self.logprobs: list[TokenLogprob] | None = [] if self.params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self._logprobs_sent = 0
        self.embedding: list[float] | None = None  # an embedding request's vector, once computed
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
            content=self.text,
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
            embedding=None if self.embedding is None else tuple(self.embedding),
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
