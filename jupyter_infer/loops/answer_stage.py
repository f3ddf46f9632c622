"""The answer stage, between the scheduling core and the request streams (vLLM's
``OutputProcessor``, SGLang's detokenizer): the one place an answer is finished. A step's
tokens (or an upstream's text) become each request's text; whether a token ends its request
(EOS, a stop sequence, ``max_tokens``) is decided here; and the text is read, as it comes, into
the pieces every dialect renders (``values/answer.py``): a reasoning model's reasoning
section, the content, and tool calls in the model's format, whole and as streamed deltas.

The stage reads what the core applied and never calls back into it: the loop hands each row's
tokens here (``take``), then closes the step with the core. A row can end in the middle of its
tokens (the rest are not kept). Detokenizing is incremental (TGI's prefix/read offsets): a
token costs O(1) however long the answer is, a character split over tokens is released only
once complete, and a tail that could still grow into a stop sequence is held back until it
cannot. Downstream, handlers only render: nothing re-reads the text or writes the record.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace
from typing import Protocol

from ..constraints.tool_formats import FORMATS, CallDelta, PythonCallParser
from ..constraints.tools import CallParser, parser_for
from ..text.reasoning import ReasoningSplitter
from ..values.answer import AnswerPiece
from ..values.request import RequestResult, TokenEvent, TokenLogprob
from ..values.sequence import Sequence


@dataclass
class AnswerState:
    """One answer's state: its detokenizing (the text of all its output tokens, which may hold
    back a stop-string prefix or an unfinished character, and TGI's offsets) and its reading
    (reasoning split, tool-call parser, what each has read)."""

    decoded: str = ""
    prefix_offset: int = 0
    read_offset: int = 0
    splitter: ReasoningSplitter | None = None  # a reasoning model's chat
    parser: CallParser | PythonCallParser | None = None  # a tools request's: its calls, read as they come
    named: bool = False  # its tool_choice names a tool: calls to it keep "stop", as OpenAI's do
    reasoning: str = ""
    content: str = ""  # the answer after the reasoning section (kept only where there is a splitter:
    closed: bool = False  # otherwise it is the sequence's text)
    stop: str | None = None  # the stop sequence that ended it (Anthropic's ``stop_sequence`` names it)


class Detokenizer(Protocol):
    """What the stage reads of the model's text side (``text/model_text.py``): ``detokenize``
    and its EOS ids (read at each token: a bench or a test may empty them while it serves)."""

    eos_token_ids: frozenset[int]

    def detokenize(self, token_ids: Seq[int]) -> str: ...


class AnswerStage:
    """Finishes the answers of one loop: an engine's (``tokenizer`` detokenizes its tokens) or
    an upstream's (``None``: its text comes as text)."""

    def __init__(self, tokenizer: Detokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def open(self, seq: Sequence, tool_format: str, reasons: bool) -> None:
        """How ``seq``'s answer will be read: split into reasoning and content where its
        model reasons and it is a chat (``reasons``), read for calls in ``tool_format`` where
        it offered tools."""
        state = AnswerState()
        if reasons and seq.request.messages is not None:
            state.splitter = ReasoningSplitter(seq.request.opened_reasoning)
        constraint = seq.params.constraint
        if constraint is not None and constraint.kind == "tools":
            state.parser = parser_for(FORMATS[tool_format])
            state.named = constraint.tools.named
        seq.answer = state

    # -- an engine's tokens ----------------------------------------------------------------
    def take(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None,
             now: float) -> tuple[list[int], TokenEvent | None]:
        """Append ``tokens`` to ``seq`` until one ends it: the tokens kept, and what they add
        to the answer (``None``: nothing to tell yet)."""
        kept, text = [], ""
        for i, token in enumerate(tokens):
            kept.append(token)
            text += self.append(seq, token, now, logprobs[i] if logprobs else None)
            if seq.finish_reason is not None:
                break
        pieces = self._read(seq, text)
        if seq.finish_reason is not None:
            seq.finish_reason, end = self._close(seq, seq.finish_reason)
            pieces += end
        return kept, self._event(seq, kept[-1] if kept else -1, text, pieces)

    # -- an upstream's text ----------------------------------------------------------------
    def take_text(self, seq: Sequence, text: str, token_id: int) -> TokenEvent | None:
        """A piece of an upstream's answer (already on ``seq.text``), read."""
        return self._event(seq, token_id, text, self._read(seq, text))

    def end_text(self, seq: Sequence, reason: str, token_id: int) -> tuple[str, TokenEvent | None]:
        """The upstream ended ``seq`` for ``reason``: the finish reason to record (a tools
        answer that is calls: "tool_calls"), and the answer's last pieces."""
        reason, pieces = self._close(seq, reason)
        return reason, self._event(seq, token_id, "", pieces)

    # -- the answer ------------------------------------------------------------------------
    def result(self, seq: Sequence) -> RequestResult:
        """A finished sequence's result, with its answer as read: reasoning, content, calls."""
        result = seq.result()
        state = seq.answer
        if state is None:
            return result
        if not state.closed:  # cancelled: what it had, as it stood
            self._close(seq, result.finish_reason)
        parser = state.parser
        calls = None
        if parser is not None and parser.mode == "calls" and result.finish_reason in ("stop", "length", "tool_calls"):
            calls = tuple(parser.calls)
        reasoned = state.splitter is not None and state.splitter.reasoned
        return replace(result, reasoning=state.reasoning if reasoned else None,
                       content=None if calls is not None else state.content if state.splitter else result.text,
                       tool_calls=calls, whole_calls=parser.complete if calls is not None else 0,
                       stop_sequence=state.stop)

    def _read(self, seq: Sequence, text: str) -> list[AnswerPiece]:
        """``text`` as pieces: reasoning, then content or calls."""
        state = seq.answer
        if state is None or not text:
            return [AnswerPiece("content", text)] if text else []
        parts = state.splitter.feed(text) if state.splitter is not None else [("content", text)]
        return self._pieces(state, parts)

    def _pieces(self, state: AnswerState, parts: list[tuple[str, str]]) -> list[AnswerPiece]:
        out: list[AnswerPiece] = []
        for kind, text in parts:
            if kind == "reasoning":
                state.reasoning += text
                out.append(AnswerPiece("reasoning", text))
            elif state.parser is None:
                self._content(state, text)
                out.append(AnswerPiece("content", text))
            else:
                out += self._calls(state, state.parser.feed(text))
        return out

    def _calls(self, state: AnswerState, deltas: list[CallDelta]) -> list[AnswerPiece]:
        out = []
        for d in deltas:
            if d.content is not None:
                self._content(state, d.content)
                out.append(AnswerPiece("content", d.content))
            else:
                out.append(AnswerPiece("call", d.arguments or "", d.index, d.id, d.name))
        return out

    @staticmethod
    def _content(state: AnswerState, text: str) -> None:
        if state.splitter is not None:  # else the content is the sequence's text: no second copy
            state.content += text

    def _close(self, seq: Sequence, reason: str) -> tuple[str, list[AnswerPiece]]:
        """The end of ``seq``'s answer: what its splitter and parser held back, and its finish
        reason ("tool_calls" for an answer that is calls, unless they call the tool named)."""
        state = seq.answer
        if state is None or state.closed:
            return reason, []
        state.closed = True
        pieces = self._pieces(state, state.splitter.finish()) if state.splitter is not None else []
        parser = state.parser
        if parser is not None:
            pieces += self._calls(state, parser.finish())
            if reason == "stop" and parser.mode == "calls" and parser.calls and not state.named:
                reason = "tool_calls"
        return reason, pieces

    def _event(self, seq: Sequence, token_id: int, text: str, pieces: list[AnswerPiece]) -> TokenEvent | None:
        logprobs, prompt_logprobs = seq.take_logprobs()
        if not (text or pieces or logprobs or prompt_logprobs is not None):
            return None
        return TokenEvent(seq.id, seq.num_output_tokens, token_id, text, logprobs, prompt_logprobs, tuple(pieces))

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
        state = seq.answer if seq.answer is not None else AnswerState()
        seq.answer = state
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
                state.stop = stop
                seq.finish_reason = "stop"
                return self._release(seq, state, final=True)
        if len(seq.output_ids) >= params.max_tokens:
            seq.finish_reason = "length"
            return self._release(seq, state, final=True, flush=True)
        return self._release(seq, state, final=False)

    def _decode_tail(self, seq: Sequence, state: AnswerState, *, final: bool) -> None:
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

    def _release(self, seq: Sequence, state: AnswerState, final: bool, flush: bool = False) -> str:
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
