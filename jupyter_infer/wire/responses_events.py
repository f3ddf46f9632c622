"""The Responses API's stream (``POST infer/v1/responses`` with ``stream: true``): the answer
stage's pieces (``values/answer.AnswerPiece``) as OpenAI's events, in its documented order,
each with its ``sequence_number``.

``response.created``, ``response.in_progress``; then per output item, as the answer's pieces
change kind: ``response.output_item.added``, its content (a message's and a reasoning item's
``content_part.added``, ``…output_text.delta`` / ``…reasoning_text.delta`` …, ``….done``,
``content_part.done``; a call's ``function_call_arguments.delta`` …, ``….done``),
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` past
``max_output_tokens``; ``error`` and ``response.failed`` for a late failure).
"""

from __future__ import annotations

from typing import Any

from ..errors import InferError
from ..values.answer import AnswerPiece
from ..values.request import RequestResult
from .openai_responses import (
    ResponseShape,
    call_item,
    item_id,
    message_item,
    reasoning_item,
    text_part,
)

Event = tuple[str, dict[str, Any]]  # an SSE event's name and its data


class ResponseEvents:
    """The events of one answer: ``start``, ``pieces`` as they come, then ``end`` (or
    ``failed``). Each item's text is kept as it streams, for its ``done`` events."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # the items added so far, done or open, in order
        self.open: tuple[str, int] | None = None  # the open item's piece kind, and its call's index
        self.text = ""  # the open item's text (or arguments) so far

    def _event(self, kind: str, **data: Any) -> Event:
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence - 1, **data}

    def start(self) -> list[Event]:
        shell = self.shape.base("in_progress", [])
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def pieces(self, pieces: tuple[AnswerPiece, ...]) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if not piece.text and not piece.opens_call:
                continue
            if piece.opens_call or self.open != (piece.kind, piece.index):
                events += self._close("completed")
                events += self._open(piece)
            if piece.text:
                self.text += piece.text
                events.append(self._delta(piece.text))
        return events

    def end(self, result: RequestResult) -> tuple[list[Event], dict[str, Any]]:
        """The last events, and the whole response (what a later ``GET`` returns). An item the
        pieces never opened (an empty text answer) is added and done here."""
        events = self._close("incomplete" if result.finish_reason == "length" else "completed")
        response = self.shape.whole(result)
        sent = {item["id"] for item in self.items}
        for item in response["output"]:
            if item["id"] not in sent:
                events += self._whole_item(item)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=response)], response

    def failed(self, err: InferError) -> list[Event]:
        """A failure after the stream started: an ``error`` event, then ``response.failed``."""
        events = self._close("incomplete")
        events.append(self._event("error", code=err.code, message=err.message, param=err.param))
        return [*events, self._event("response.failed", response=self.shape.failed(err, self.items))]

    # -- one item's events ---------------------------------------------------------------------
    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _where(self, content: bool = True) -> dict[str, Any]:
        where = {"item_id": self.items[-1]["id"], "output_index": self._index}
        return {**where, "content_index": 0} if content else where

    def _open(self, piece: AnswerPiece) -> list[Event]:
        rid = self.shape.request_id
        self.open, self.text = (piece.kind, piece.index), ""
        if piece.kind == "call":
            item = call_item(rid, piece.index, piece.call_id or item_id("call", rid, piece.index), piece.name or "",
                             "", "in_progress")
            self.items.append(item)
            return [self._event("response.output_item.added", output_index=self._index, item=dict(item))]
        if piece.kind == "reasoning":
            item, part = reasoning_item(rid, "", "in_progress"), {"type": "reasoning_text", "text": ""}
        else:
            item, part = message_item(rid, "", "in_progress"), text_part("")
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=self._index, item={**item, "content": []}),
                self._event("response.content_part.added", **self._where(), part=part)]

    def _delta(self, text: str) -> Event:
        kind = self.open[0] if self.open else "content"
        if kind == "call":
            return self._event("response.function_call_arguments.delta", **self._where(False), delta=text)
        if kind == "reasoning":
            return self._event("response.reasoning_text.delta", **self._where(), delta=text)
        return self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def _close(self, status: str) -> list[Event]:
        if self.open is None:
            return []
        kind, self.open = self.open[0], None
        item = self.items[-1]
        item["status"] = status
        if kind == "call":
            item["arguments"] = self.text
            return [self._event("response.function_call_arguments.done", **self._where(False), name=item["name"],
                                arguments=self.text),
                    self._event("response.output_item.done", output_index=self._index, item=dict(item))]
        part = {"type": "reasoning_text", "text": self.text} if kind == "reasoning" else text_part(self.text)
        item["content"] = [part]
        done = (self._event("response.reasoning_text.done", **self._where(), text=self.text) if kind == "reasoning"
                else self._event("response.output_text.done", **self._where(), text=self.text, logprobs=[]))
        return [done, self._event("response.content_part.done", **self._where(), part=part),
                self._event("response.output_item.done", output_index=self._index, item=dict(item))]

    def _whole_item(self, item: dict[str, Any]) -> list[Event]:
        """An item added and done at once (its content whole)."""
        self.items.append(item)
        events = [self._event("response.output_item.added", output_index=self._index,
                              item={**item, "status": "in_progress", **({"content": []} if "content" in item else {})})]
        for part in item.get("content", []):
            done = f"response.{part['type']}.done"  # output_text, reasoning_text
            events += [self._event("response.content_part.added", **self._where(), part={**part, "text": ""}),
                       self._event(done, **self._where(), text=part["text"],
                                   **({"logprobs": []} if part["type"] == "output_text" else {})),
                       self._event("response.content_part.done", **self._where(), part=part)]
        return [*events, self._event("response.output_item.done", output_index=self._index, item=item)]
