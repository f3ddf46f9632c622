"""What goes to an OpenAI-compatible upstream and what comes back: request bodies, stream
chunks, and the upstream's errors as ours. Pure functions, no I/O."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from ..constraints.tool_formats import HERMES
from ..errors import InferError, InvalidRequest, UpstreamError, UpstreamUnavailable
from ..values.request import Constraint, Request, SamplingParams

# Always sent: the upstream's defaults for these differ between servers (and from ours).
_ALWAYS = ("max_tokens", "temperature")
# A sampling knob at its default is left out: strict servers refuse fields they do not know
# (transformers serve answers 422 to top_k), and the default means "the plain behaviour".
_AS_LIST = {"stop"}


def request_body(request: Request, model: str) -> tuple[str, dict[str, Any]]:
    """The upstream route (relative to its ``/v1``) and the streaming body for ``request``.
    A chat goes upstream as a chat (the upstream applies its own chat template)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if request.messages is not None:
        path, body["messages"] = "chat/completions", request.wire_messages or request.messages
        if request.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = request.chat_template_kwargs
    else:
        path, body["prompt"] = "completions", request.prompt
        if request.suffix is not None:  # the upstream writes its own model's infill prompt
            body["suffix"] = request.suffix
    body.update(sampling_fields(request.params))
    if request.params.constraint is not None:
        body.update(constraint_fields(request.params.constraint))
    return path, body


def constraint_fields(constraint: Constraint) -> dict[str, Any]:
    """A constraint as vLLM, llama.cpp and OpenAI take it: ``response_format`` for JSON,
    ``structured_outputs`` for a regex, choice or grammar, ``tools`` for tool calls (the
    request's tool set, as its ``openai_tools``: the body's tools, whatever format a model
    would write them in)."""
    if constraint.kind == "tools":
        tools = constraint.tools
        choice = tools.choice
        return {
            "tools": tools.openai_tools(),
            "tool_choice": choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}},
            "parallel_tool_calls": tools.parallel,
        }
    value = constraint.value
    if constraint.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        spec = {"name": constraint.name or "answer", "schema": value}
        if constraint.strict is not None:
            spec["strict"] = constraint.strict
        return {"response_format": {"type": "json_schema", "json_schema": spec}}
    return {"structured_outputs": {constraint.kind: value}}


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """The request's sampling parameters in OpenAI's (and vLLM's) names."""
    out: dict[str, Any] = {}
    for f in fields(params):
        value = getattr(params, f.name)
        if f.name not in _ALWAYS and value == f.default or f.name == "constraint":
            continue
        if f.name in _AS_LIST:
            value = list(value)
        elif f.name == "logit_bias":  # ((token id, bias), ...) -> {"id": bias}
            value = {str(token): bias for token, bias in value}
        out[f.name] = value
    return out


@dataclass
class Chunk:
    """One streamed chunk: new text, and (on the last ones) why it ended and the usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def has_usage(self) -> bool:
        return self.prompt_tokens is not None or self.completion_tokens is not None


@dataclass
class CallsAsText:
    """An upstream's streamed ``tool_calls`` as the text this server's own tool format writes
    (``constraints.tools``), so its answers read back into calls like a local model's."""

    open: bool = False

    def text(self, deltas: Any, finished: bool) -> str:
        out = []
        for delta in deltas if isinstance(deltas, list) else []:
            fn = delta.get("function") if isinstance(delta, dict) else None
            if not isinstance(fn, dict):
                continue
            if isinstance(fn.get("name"), str) and fn["name"]:
                out.append(("}" + HERMES.close + HERMES.sep if self.open else "") + HERMES.open + HERMES.head(fn["name"]))
                self.open = True
            if isinstance(fn.get("arguments"), str):
                out.append(fn["arguments"])
        if finished and self.open:
            out.append("}" + HERMES.close)
            self.open = False
        return "".join(out)


def parse_chunk(data: str, calls: CallsAsText | None = None) -> Chunk | None:
    """A ``data:`` payload of the upstream's stream; ``None`` for ``[DONE]``. An error in
    the stream (vLLM and others send ``{"error": ...}`` as a chunk) raises ``UpstreamError``.
    ``calls``: the request's tool calls so far (their deltas come back as text)."""
    if data.strip() == "[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        raise UpstreamError(f"The upstream server sent a stream chunk that is not JSON: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise UpstreamError(f"The upstream server sent an unexpected stream chunk: {data[:200]!r}")
    if "error" in obj:
        raise UpstreamError(f"The upstream server failed mid-stream: {error_message(obj)}")
    chunk = Chunk()
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        chunk.text = text if isinstance(text, str) else ""
        chunk.finish_reason = choice.get("finish_reason")
        if calls is not None and isinstance(delta, dict):
            chunk.text += calls.text(delta.get("tool_calls"), chunk.finish_reason is not None)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        chunk.prompt_tokens = _count(usage.get("prompt_tokens"))
        chunk.completion_tokens = _count(usage.get("completion_tokens"))
    return chunk


def finish_reason(upstream: str | None) -> str:
    """The upstream's finish reason in ours (``stop`` | ``length``)."""
    return "length" if upstream == "length" else "stop"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def error_message(body: Any) -> str:
    """The message in an upstream's error body, whatever its dialect: OpenAI's
    ``{"error": {"message"}}``, ``{"error": "..."}`` (TGI, transformers serve),
    FastAPI's ``{"detail": ...}``, ours ``{"message"}``, or plain text."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip()[:500] or "(no message)"
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("detail") or json.dumps(value)
            if isinstance(value, list):  # FastAPI's validation details
                value = "; ".join(str(v.get("msg", v)) if isinstance(v, dict) else str(v) for v in value)
            if value:
                return str(value)[:500]
    return json.dumps(body)[:500]


def http_error(status: int, body: bytes, url: str, retry_after: str | None = None) -> InferError:
    """Our error for an upstream's error answer (before any token): its fault (5xx) is a
    502, overload (429, 503) a 503, a refused request (4xx) a 400 with its message."""
    message = error_message(body)
    where = f"The upstream server ({url}) answered {status}"
    if status in (429, 503):
        err = UpstreamUnavailable(f"{where}, it is overloaded or starting: {message}. Retry shortly.")
        err.retry_after = _seconds(retry_after)
        return err
    if status in (401, 403):
        return UpstreamError(
            f"{where}: {message}. Check InferApp.upstream_api_key (or upstream_api_key_env)."
        )
    if status == 404:
        return UpstreamError(
            f"{where}: {message}. Is InferApp.upstream_url the server's base URL ending in /v1, "
            "and InferApp.upstream_model a model it serves?"
        )
    if 400 <= status < 500:
        return InvalidRequest(f"{where}, refusing the request: {message}")
    return UpstreamError(f"{where}: {message}")


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


CHARS_PER_TOKEN = 4  # English text in a BPE vocabulary: a common rule of thumb
TOKENS_PER_MESSAGE = 4  # a chat template's role markers around each message


def estimate_tokens(request: Request) -> int:
    """The prompt's size in tokens, estimated (the upstream tokenizes, and reports the real
    count in its usage at the end): enough to apply the limits and the router's rule."""
    if request.messages is not None:
        return sum(math.ceil(len(m["content"]) / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE
                   for m in request.messages)
    return math.ceil(len(request.prompt) / CHARS_PER_TOKEN)
