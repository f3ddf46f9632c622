"""The output stage, between the scheduling core and the request streams (vLLM's
``OutputProcessor``, SGLang's detokenizer): a step's tokens become each request's text, and
whether a token ends its request (EOS, a stop sequence, ``max_tokens``) is decided here.

The core plans steps and applies what they computed (``Scheduler.apply``); this stage appends
each row's tokens to its sequence one by one, the finish rules checked after each, so a row
can end in the middle of its tokens (the rest are not kept); the core then closes the step and
retires the rows that ended (``Scheduler.close_step``). Detokenizing is incremental (TGI's
prefix/read offsets): a token costs O(1) however long the answer is, a character split over
tokens is released only once complete, and a tail that could still grow into a stop sequence
is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..values.request import TokenLogprob
from ..values.sequence import Sequence

if TYPE_CHECKING:
    from ..scheduler.scheduler import Scheduler
    from ..values.step import Sampled, StepPlan


@dataclass
class TextState:
    """A sequence's detokenizing state: the text of all its output tokens (it may hold back a
    stop-string prefix or an unfinished character) and TGI's offsets."""

    decoded: str = ""
    prefix_offset: int = 0
    read_offset: int = 0


class Detokenizer(Protocol):
    """What the stage reads of the engine: its tokenizer's ``detokenize`` and its EOS ids
    (read at each token: a bench or a test may empty them while the engine serves)."""

    eos_token_ids: frozenset[int]

    def detokenize(self, token_ids: Seq[int]) -> str: ...


class OutputStage:
    """Appends tokens to sequences and releases their text, for one engine's tokenizer."""

    def __init__(self, tokenizer: Detokenizer) -> None:
        self.tokenizer = tokenizer

    def step(self, core: Scheduler, plan: StepPlan, sampled: Sampled, started: float,
             now: float) -> list[tuple[Sequence, list[int], str]]:
        """A step's outputs through the core and this stage: the core applies what the step
        computed, each row's tokens are appended here, the core closes the step. Returns
        ``(sequence, tokens kept, text they release)`` per live row that got tokens."""
        released, kept = [], []
        for seq, output in core.apply(plan, sampled, now):
            first = seq.record.first_token_at is None
            tokens, text = self.take(seq, output.tokens, output.logprobs, now)
            core.recorder.token(seq, text, first)
            released.append((seq, tokens, text))
            kept.append((seq, output, tokens))
        core.close_step(plan, sampled, kept, started, now)
        return released

    def take(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None,
             now: float) -> tuple[list[int], str]:
        """Append ``tokens`` to ``seq`` until one ends it; the tokens kept and the text they
        release to the caller."""
        kept, text = [], ""
        for i, token in enumerate(tokens):
            kept.append(token)
            text += self.append(seq, token, now, logprobs[i] if logprobs else None)
            if seq.finish_reason is not None:
                break
        return kept, text

    def append(self, seq: Sequence, token_id: int, now: float, logprob: TokenLogprob | None = None) -> str:
        """Add one generated token; return the text fragment it releases.

        Sets ``finish_reason`` when this token ends the sequence (EOS unless ``ignore_eos``
        or fewer than ``min_tokens`` yet, a stop sequence once ``min_tokens`` exist, or
        ``max_tokens``; ``max_tokens=0`` ends at once, without the token)."""
        if seq.record.first_token_at is None:
            seq.record.first_token_at = now
        params = seq.params
        if params.max_tokens == 0:  # only the prompt was wanted (echo with logprobs)
            seq.finish_reason = "length"
            return ""
        state = seq.text_state if seq.text_state is not None else TextState()
        seq.text_state = state
        if token_id in self.tokenizer.eos_token_ids and not params.ignore_eos and len(seq.output_ids) >= params.min_tokens:
            seq.finish_reason = "stop"
            return self._release(seq, state, final=True, flush=True)
        seq.output_ids.append(token_id)
        if seq.logprobs is not None and logprob is not None:
            seq.logprobs.append(logprob)
        self._decode_tail(seq, state, final=False)
        for stop in params.stop if len(seq.output_ids) >= params.min_tokens else ():
            at = state.decoded.find(stop, max(0, len(seq.text) - len(stop)))
            if at != -1:
                state.decoded = state.decoded[:at]
                seq.finish_reason = "stop"
                return self._release(seq, state, final=True)
        if len(seq.output_ids) >= params.max_tokens:
            seq.finish_reason = "length"
            return self._release(seq, state, final=True, flush=True)
        return self._release(seq, state, final=False)

    def _decode_tail(self, seq: Sequence, state: TextState, *, final: bool) -> None:
        """Decode the tokens after the read offset. A tail that ends inside a character (U+FFFD)
        waits for the next token, unless this is the end: then it is released as the tokenizer
        decodes it (vLLM does the same), or the answer's last characters would be lost."""
        ids = seq.output_ids
        detokenize = self.tokenizer.detokenize
        prefix = detokenize(ids[state.prefix_offset : state.read_offset])
        full = detokenize(ids[state.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            state.decoded += full[len(prefix) :]
            state.prefix_offset = state.read_offset
            state.read_offset = len(ids)

    def _release(self, seq: Sequence, state: TextState, final: bool, flush: bool = False) -> str:
        """The text not handed out yet that may go now. At the end with ``flush`` (EOS,
        ``max_tokens``; not a stop sequence, whose cut already fell), a held-back tail of an
        incomplete character goes too."""
        if final and flush and state.read_offset < len(seq.output_ids):
            self._decode_tail(seq, state, final=True)
        end = len(state.decoded)
        if not final:
            # Hold back a tail that could still grow into a stop sequence.
            end -= longest_stop_prefix(state.decoded, seq.params.stop)
            # And a trailing CR: with an LF in the next fragment it is one line break, but as
            # two SSE fragments a reader would see two.
            if end > len(seq.text) and state.decoded[end - 1] == "\r":
                end -= 1
        fragment = state.decoded[len(seq.text) : end]
        seq.text += fragment
        return fragment


def longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
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
