"""``Completion``: one finished request, as the server answered it plus the client's times."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...values.request import token_usage


@dataclass
class Completion:
    """One finished request: the JSON of ``POST infer/generate`` plus client-side times.

    ``sent_at``/``received_at`` are wall-clock epoch seconds seen by the client. A request
    that failed inside a ``burst`` has ``finish_reason == "error"`` and ``error`` set.
    ``parsed`` is the answer read as the ``schema`` it was asked to fit. ``counted_fragments`` is True when the server sent no final result (an older server):
    ``completion_tokens`` then counts the text fragments received, which can be fewer than
    the tokens generated, and the timings are the client's own.
    """

    id: str | None
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_id: int | None = None
    batch_size: int = 0
    queued_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt: str | None = None
    sent_at: float | None = None
    received_at: float | None = None
    error: str | None = None
    counted_fragments: bool = False
    # ``generate(..., schema=...)``: the answer parsed (a pydantic model's instance, or the
    # JSON value); None when it was cut short (``finish_reason == "length"``).
    parsed: Any = None
    # ``chat(..., tools=...)``: the calls the answer makes (OpenAI's ``tool_calls`` entries:
    # ``id``, ``type``, ``function.name``, ``function.arguments`` as JSON text); ``text`` is
    # then the answer's text besides them ("" for an answer that is calls).
    tool_calls: list[dict[str, Any]] | None = None
    # The model that answered, as the server names it (``simulated``: the simulated engine).
    model: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], **extra: Any) -> Completion:
        """From the contract's result JSON (``infer/generate``, or a stream's ``result`` event)."""
        usage = data.get("usage") or {}
        batch = data.get("batch") or {}
        timings = data.get("timings") or {}
        return cls(
            id=data.get("id"),
            text=data.get("text", ""),
            finish_reason=data.get("finish_reason", ""),
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            batch_id=batch.get("id"),
            batch_size=batch.get("size", 0),
            queued_ms=timings.get("queued_ms"),
            ttft_ms=timings.get("ttft_ms"),
            total_ms=timings.get("total_ms"),
            model=data.get("model"),
            **extra,
        )

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``infer/generate``), plus the client-side fields."""
        return {
            "id": self.id,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": token_usage(self.prompt_tokens, self.completion_tokens),
            "batch": {"id": self.batch_id, "size": self.batch_size},
            "timings": {"queued_ms": self.queued_ms, "ttft_ms": self.ttft_ms, "total_ms": self.total_ms},
            "prompt": self.prompt,
            "sent_at": self.sent_at,
            "received_at": self.received_at,
            "error": self.error,
            "counted_fragments": self.counted_fragments,
            "model": self.model,
        }

    def __str__(self) -> str:
        return self.text
