"""Ollama's answers (``api/chat``, ``api/generate``): the answer stage's result, or its pieces
as they stream, as Ollama's objects: ``message`` (``content``, ``thinking``, ``tool_calls`` with
their arguments as objects) or ``response``, then ``done``, ``done_reason`` and the counts and
durations (ns). A stream is NDJSON: one object per line, the last one ``done: true`` (or a
late ``{"error": ...}``). The bodies are read in ``ollama_api``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from ..values.answer import AnswerPiece
from ..values.request import RequestResult
from .ollama_api import OllamaCall

Line = dict[str, Any]  # one object of an answer (a line of a stream)


def now() -> str:
    """Ollama's ``created_at``: RFC 3339, UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def done_reason(result: RequestResult) -> str:
    """``length`` where ``num_predict`` (or the context) cut it short, else ``stop`` (tool
    calls included, as Ollama says)."""
    return "length" if result.finish_reason == "length" else "stop"


def done_fields(result: RequestResult, total_s: float, load_s: float) -> Line:
    """The final object's counts and durations in nanoseconds: the whole call as the handler
    saw it, its wait for the model (a load on demand), the prompt's evaluation (queue to first
    token), the answer's."""
    ttft = result.ttft_ms if result.ttft_ms is not None else result.total_ms
    return {"done": True, "done_reason": done_reason(result), "total_duration": int(total_s * 1e9),
            "load_duration": int(load_s * 1e9), "prompt_eval_count": result.prompt_tokens,
            "prompt_eval_duration": int(max(0.0, ttft - result.queued_ms) * 1e6),
            "eval_count": result.completion_tokens, "eval_duration": int(max(0.0, result.total_ms - ttft) * 1e6)}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {}  # not reached for a whole call: its grammar made it JSON


def tool_call(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One call as Ollama writes it: its arguments an object, not JSON text."""
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": _arguments(arguments)}}


def whole_calls(result: RequestResult) -> list[dict[str, Any]]:
    """The answer's whole calls (one cut short by ``num_predict`` is not callable)."""
    return [tool_call(i, c["id"], c["function"]["name"], c["function"]["arguments"])
            for i, c in enumerate((result.tool_calls or ())[: result.whole_calls])]


def answer(call: OllamaCall, result: RequestResult, total_s: float, load_s: float) -> Line:
    """The whole answer: a chat's ``message``, or a generate's ``response``."""
    out: Line = {"model": call.model, "created_at": now()}
    if call.chat:
        message: dict[str, Any] = {"role": "assistant", "content": result.content or ""}
        if result.reasoning is not None:
            message["thinking"] = result.reasoning
        calls = whole_calls(result)
        if calls:
            message["tool_calls"] = calls
        out["message"] = message
    else:
        out["response"] = result.content if result.content is not None else result.text
        if result.reasoning is not None:
            out["thinking"] = result.reasoning
    return out | done_fields(result, total_s, load_s)


def loaded(call: OllamaCall, reason: str) -> Line:
    """The answer to a body that asks only to load (``load``) or unload (``unload``) the model."""
    body = {"message": {"role": "assistant", "content": ""}} if call.chat else {"response": ""}
    return {"model": call.model, "created_at": now(), **body, "done": True, "done_reason": reason}


class AnswerLines:
    """A streamed answer's objects: ``pieces`` as they come (text and thinking at once; each
    tool call whole, once the next piece shows it has ended), then ``end``."""

    def __init__(self, call: OllamaCall) -> None:
        self.call = call
        self.open: dict[int, list[str]] = {}  # calls being written: index → [id, name, arguments so far]
        self.sent: set[int] = set()

    def _line(self, **fields: Any) -> Line:
        if self.call.chat:
            body: Line = {"message": {"role": "assistant", "content": fields.pop("content", ""), **fields}}
        else:
            body = {"response": fields.pop("content", ""), **fields}
        return {"model": self.call.model, "created_at": now(), **body, "done": False}

    def pieces(self, pieces: tuple[AnswerPiece, ...]) -> list[Line]:
        lines: list[Line] = []
        for piece in pieces:
            if piece.kind != "call" or piece.opens_call:
                lines += self._ended_calls()
            if piece.kind == "call":
                entry = self.open.setdefault(piece.index, [piece.call_id or f"call_{piece.index}", piece.name or "", ""])
                entry[2] += piece.text
            elif piece.text:
                key = "thinking" if piece.kind == "reasoning" else "content"
                lines.append(self._line(**{key: piece.text}))
        return lines

    def _ended_calls(self) -> list[Line]:
        """The calls written so far, each once its arguments read as JSON (else at the end)."""
        calls = []
        for index, (call_id, name, text) in sorted(self.open.items()):
            try:
                json.loads(text)
            except ValueError:
                continue
            calls.append(tool_call(index, call_id, name, text))
            del self.open[index]
            self.sent.add(index)
        return [self._line(tool_calls=calls)] if calls and self.call.chat else []

    def end(self, result: RequestResult, total_s: float, load_s: float) -> list[Line]:
        """The calls not sent yet (as the answer stage finished them), then the ``done`` object."""
        rest = [c for i, c in enumerate(whole_calls(result)) if i not in self.sent]
        lines = [self._line(tool_calls=rest)] if rest and self.call.chat else []
        last = self._line()
        last.update(done_fields(result, total_s, load_s))
        return [*lines, last]


def ndjson(lines: list[Line]) -> str:
    """Objects as NDJSON: one JSON object per line."""
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def error_json(message: str) -> dict[str, str]:
    """An error in Ollama's shape (its client raises ``ResponseError`` with the text)."""
    return {"error": message}
