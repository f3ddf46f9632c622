"""What an answer is made of as it streams, once the answer stage has read it
(``loops/answer_stage.py``): reasoning, text, and tool calls, in the order they came.

Every dialect renders these pieces (OpenAI's ``delta.reasoning_content``, ``delta.content`` and
``delta.tool_calls``; the others' events): none of them reads the model's text again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PieceKind = Literal["reasoning", "content", "call"]


@dataclass(frozen=True)
class AnswerPiece:
    """One piece of an answer: ``reasoning`` text (a reasoning model's ``<think>`` section),
    ``content`` text (the answer a user reads), or part of a tool ``call``: its first piece
    names it (``call_id``, ``name``), the next ones carry its arguments' JSON text as it comes.
    ``index`` is the call's place among the answer's calls."""

    kind: PieceKind
    text: str = ""
    index: int = 0
    call_id: str | None = None
    name: str | None = None

    @property
    def opens_call(self) -> bool:
        return self.kind == "call" and self.call_id is not None

