"""What a caller asks for (``Request``) and what comes back (``TokenEvent``, ``RequestResult``).

Validation lives here so that every front (HTTP handlers, the OpenAI routes, the embedded
client) rejects the same bad input with the same message, before anything is enqueued.
"""

from __future__ import annotations

import itertools
import re
import reprlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidRequest

MAX_STOP_SEQUENCES = 4
# Each token checks every stop sequence against the text's tail, on the event loop: a long
# one would make every step of the batch slow.
MAX_STOP_CHARS = 256
_counter = itertools.count()
_SURROGATE = re.compile("[\ud800-\udfff]")
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60  # a value quoted back in an error message stays short
_shown.maxlevel = 3


def show(value: Any) -> str:
    """``repr(value)``, cut short: error messages quote what was sent without echoing a
    megabyte or recursing into a deeply nested value."""
    return _shown.repr(value)


def short(name: str) -> str:
    """A name (a field, a parameter) as sent, cut short for an error message."""
    return name if len(name) <= 60 else show(name)


def check_text(text: str, name: str) -> str:
    """Refuse text that is not valid Unicode: a lone surrogate (JSON's ``"\\ud800"``, or
    the bytes ED A0 80) cannot be encoded, tokenized or streamed back."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise InvalidRequest(
            f"'{name}' holds a lone surrogate (U+{ord(bad.group()):04X} at character {bad.start()}), "
            "which is not valid Unicode text. Send UTF-8 text; in JSON, a character outside the "
            "Basic Multilingual Plane is a surrogate pair such as \\ud83d\\ude00.", param=name,
        )
    return text


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy decoding; ``max_tokens=None``
    means as many as fit (the service resolves it before queueing)."""

    max_tokens: int | None = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Request:
    """What to generate from: a ``prompt``, or chat ``messages`` that the service renders
    with the model's chat template (then ``prompt`` is filled in)."""

    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    messages: list[dict[str, str]] | None = None
    priority: int = 0
    id: str = field(default_factory=new_request_id)
    arrival: float = field(default_factory=time.monotonic)
    # FIFO tie-break within a priority, immune to equal timestamps.
    order: int = field(default_factory=lambda: next(_counter))


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    index: int
    token_id: int
    text: str  # the new text fragment (may be "" while a multi-byte character is incomplete)


@dataclass(frozen=True)
class RequestResult:
    id: str
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    batch_id: int | None
    batch_size: int
    queued_ms: float
    ttft_ms: float | None
    total_ms: float
    token_ids: tuple[int, ...] = field(default=(), repr=False)  # the generated tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
            "batch": {"id": self.batch_id, "size": self.batch_size},
            "timings": {
                "queued_ms": round(self.queued_ms, 2),
                "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 2),
                "total_ms": round(self.total_ms, 2),
            },
        }


GENERATE_FIELDS = {
    "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "priority",
}


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{name}' must be a number between {lo} and {hi}.", param=name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"'{name}' must be between {lo} and {hi}; got {show(value)}.", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer between {lo} and {hi}.", param=name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"'{name}' must be between {lo} and {hi}; got {show(value)}.", param=name)
    return value


def parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise InvalidRequest("'stop' must be a non-empty string or a list of them.", param="stop")
    if len(value) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(
            f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences; got {len(value)}.", param="stop"
        )
    if max(map(len, value)) > MAX_STOP_CHARS:
        raise InvalidRequest(f"A 'stop' sequence may hold at most {MAX_STOP_CHARS} characters.", param="stop")
    return tuple(check_text(s, "stop") for s in value)


def parse_sampling(
    body: Mapping[str, Any], *, max_new_tokens: int, default_max_tokens: int | None = 64,
    default_temperature: float = 0.0,
) -> SamplingParams:
    """Sampling parameters from a JSON body (the service checks them against its limits)."""
    max_tokens = body.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
    ):
        raise InvalidRequest(
            f"'max_tokens' must be a positive integer (at most {max_new_tokens}); got {show(max_tokens)}.",
            param="max_tokens",
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", default_temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        top_k=_integer(body, "top_k", 0, 0, 100_000) or 0,
        seed=_integer(body, "seed", None, 0, 2**63 - 1),
        stop=parse_stop(body.get("stop")),
    )


def check_prompt(prompt: Any, name: str = "prompt") -> str:
    if not isinstance(prompt, str):
        raise InvalidRequest(f"'{name}' must be a string.", param=name)
    if not prompt.strip():
        raise InvalidRequest(f"'{name}' is empty: send some text to complete.", param=name)
    return prompt


def parse_generate_body(body: Any, *, max_new_tokens: int) -> Request:
    """Build a ``Request`` from the body of ``POST infer/generate``; raise ``InvalidRequest``."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"Unknown field(s): {', '.join(map(short, unknown))}. Allowed: {', '.join(sorted(GENERATE_FIELDS))}.",
            param=short(unknown[0]),
        )
    prompt = check_prompt(body.get("prompt"))
    params = parse_sampling(body, max_new_tokens=max_new_tokens)
    priority = _integer(body, "priority", 0, -1000, 1000) or 0
    return Request(prompt=prompt, params=params, priority=priority)
