"""A reasoning model's answer, split: the ``<think>…</think>`` section as ``reasoning_content``,
the rest as ``content`` (what vLLM's reasoning parsers and DeepSeek's API send).

Qwen3 opens the section itself (``<think>`` is the answer's first token); DeepSeek-R1's
distills get it from their chat template (the prompt ends in ``<think>``), so their answer
starts inside it. A section that never closes (``max_tokens`` reached) is all reasoning, and
the finish reason says why. Streamed, ``ReasoningSplitter`` holds back only what could still
be the start of a tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<think>", "</think>"


def reasons(tokenizer: Any) -> bool:
    """Whether the model writes a ``<think>…</think>`` section (Qwen3, DeepSeek-R1's
    distills): both tags are tokens of its own, and its chat template speaks of them."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "</think>" not in template:
        return False
    vocab = tokenizer.get_vocab()
    return "<think>" in vocab and "</think>" in vocab


def opens_reasoning(prompt_tail: str) -> bool:
    """Whether a prompt ending in ``prompt_tail`` opened the section (DeepSeek-R1's template)."""
    return prompt_tail.rstrip().endswith(OPEN)


def split_reasoning(text: str, inside: bool = False) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a whole answer; ``inside``: the prompt opened the section.
    ``reasoning`` is None for an answer without one."""
    splitter = ReasoningSplitter(inside)
    pieces = splitter.feed(text) + splitter.finish()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
    content = "".join(t for kind, t in pieces if kind == "content")
    return (reasoning if splitter.reasoned else None), content


@dataclass
class ReasoningSplitter:
    """Feed the answer's text as it streams; get ``(kind, text)`` pieces, kind ``reasoning``
    or ``content``."""

    inside: bool = False  # in the reasoning section now
    reasoned: bool = False  # a section was opened (by the prompt or the answer)
    _state: str = "start"  # start (the answer may open a section) | reasoning | after | content
    _held: str = ""  # text that may be the start of a tag
    _pieces: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.inside:
            self._state, self.reasoned = "reasoning", True

    def feed(self, text: str) -> list[tuple[str, str]]:
        buffer, self._held = self._held + text, ""
        while buffer:
            if self._state == "start":
                stripped = buffer.lstrip()
                if OPEN.startswith(stripped) and len(stripped) < len(OPEN):
                    self._held = buffer  # could still open a section
                    break
                if stripped.startswith(OPEN):
                    self._state, self.reasoned = "reasoning", True
                    buffer = stripped[len(OPEN):]
                    continue
                self._state = "content"
            if self._state == "after":  # the newlines after the section are not the answer's
                buffer = buffer.lstrip("\n")
                if not buffer:
                    break
                self._state = "content"
            if self._state == "content":
                self._emit("content", buffer)
                break
            end = buffer.find(CLOSE)
            if end >= 0:
                self._emit("reasoning", buffer[:end])
                self._state, buffer = "after", buffer[end + len(CLOSE):]
                continue
            keep = _partial_tail(buffer, CLOSE)
            self._emit("reasoning", buffer[: len(buffer) - keep])
            self._held = buffer[len(buffer) - keep:]
            break
        out, self._pieces = self._pieces, []
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The end of the answer: what was held back goes out as it stands."""
        held, self._held = self._held, ""
        if held:
            self._emit("reasoning" if self._state == "reasoning" else "content", held)
        out, self._pieces = self._pieces, []
        return out

    def _emit(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._pieces and self._pieces[-1][0] == kind:
            self._pieces[-1] = (kind, self._pieces[-1][1] + text)
        else:
            self._pieces.append((kind, text))


def _partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
