"""The OpenAI-compatible shapes: request bodies in, completion objects and chunks out.

Only what this server does is accepted (one choice, text in and out); a parameter it would
have to ignore is refused with 400, so a client never gets silently different behaviour.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine import EngineInfo
from ..errors import InferError, InvalidRequest
from ..request import Request, RequestResult, check_prompt, parse_sampling, short, show

OPENAI_DEFAULT_TEMPERATURE = 1.0
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions route
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

_SAMPLING = {"max_tokens", "temperature", "top_p", "stop", "seed"}
_COMMON = _SAMPLING | {"model", "stream", "stream_options", "n", "user", "frequency_penalty",
                       "presence_penalty", "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                         "response_format", "store", "metadata", "tools", "tool_choice",
                         "parallel_tool_calls", "functions", "function_call"}
# Accepted only at the value that means "the plain behaviour"; anything else is refused.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False),
    "top_logprobs": (None, 0), "suffix": (None, ""), "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0), "logit_bias": (None, {}), "tools": (None, []),
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True), "store": (None, False),
}
_WHY = {
    "n": "this server returns one choice per request; send n=1 and repeat the request",
    "best_of": "this server returns one choice per request",
    "logprobs": "log probabilities are not returned by this server",
    "top_logprobs": "log probabilities are not returned by this server",
    "tools": "tool calling is not supported by this server",
    "tool_choice": "tool calling is not supported by this server",
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
}


class UnknownModel(InvalidRequest):
    code = "model_not_found"


def error_body(err: InferError) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    kind = {400: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
            503: "service_unavailable_error"}.get(err.status, "invalid_request_error" if err.status < 500 else "server_error")
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def model_names(info: EngineInfo) -> list[str]:
    """The served model's name first, then the aliases a client may use for it."""
    served = info.model
    names = [served, Path(served).name, "default"]
    return list(dict.fromkeys(n for n in names if n))


def models_list(info: EngineInfo, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": info.model, "object": "model", "created": created, "owned_by": "jupyter_infer"}
    ]}


@dataclass
class OpenAIRequest:
    request: Request
    model: str
    stream: bool
    include_usage: bool


def _check_fields(body: Any, allowed: set[str], route: str) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(
            f"Unsupported parameter(s) for {route}: {', '.join(map(short, unknown))}. "
            f"This server accepts: {', '.join(sorted(allowed))}.", param=short(unknown[0]),
        )
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if name in body and not any(_same(value, v) for v in neutral):
            why = _WHY.get(name, f"this server only supports the default for '{name}'")
            raise InvalidRequest(f"Unsupported value for '{name}': {show(value)} ({why}).", param=name)
    return body


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is ``neutral``: numbers by value (``0.0`` is ``0``), never a bool for a
    number (``False`` is not ``0``), everything else by type and value."""
    if isinstance(neutral, bool) or isinstance(value, bool) or neutral is None:
        return value is neutral
    if isinstance(neutral, (int, float)):
        return isinstance(value, (int, float)) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _check_model(body: Mapping[str, Any], info: EngineInfo) -> str:
    names = model_names(info)
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str) or model not in names:
        raise UnknownModel(
            f"The model {show(model)} is not served here; use {names[0]!r} "
            f"(see GET infer/v1/models).", param="model",
        )
    return names[0]


def _check_stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with stream=true.", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
        options.get("include_usage", False), bool
    ):
        raise InvalidRequest(
            "'stream_options' takes only {\"include_usage\": true|false}.", param="stream_options"
        )
    return stream, options.get("include_usage", False)


def _sampling_body(body: Mapping[str, Any], max_tokens: Any) -> dict[str, Any]:
    out = {k: body[k] for k in _SAMPLING if k in body}
    out["max_tokens"] = max_tokens
    return out


def parse_completion(body: Any, info: EngineInfo, *, max_new_tokens: int) -> OpenAIRequest:
    """``POST infer/v1/completions`` → a ``Request``; raises ``InvalidRequest``."""
    body = _check_fields(body, COMPLETION_FIELDS, "completions")
    model = _check_model(body, info)
    stream, include_usage = _check_stream(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise InvalidRequest(
                "'prompt' must be a string (or a list of exactly one string); token arrays and "
                "several prompts per request are not supported.", param="prompt",
            )
        prompt = prompt[0]
    prompt = check_prompt(prompt)
    params = parse_sampling(
        _sampling_body(body, body.get("max_tokens")), max_new_tokens=max_new_tokens,
        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        default_temperature=OPENAI_DEFAULT_TEMPERATURE,
    )
    return OpenAIRequest(Request(prompt=prompt, params=params), model, stream, include_usage)


def _message_text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    f"messages[{index}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                    "are supported.", param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string.", param="messages")


def parse_chat(body: Any, info: EngineInfo, *, max_new_tokens: int) -> OpenAIRequest:
    """``POST infer/v1/chat/completions`` → a ``Request`` for the chat (the service renders
    it with the model's chat template)."""
    body = _check_fields(body, CHAT_FIELDS, "chat/completions")
    model = _check_model(body, info)
    stream, include_usage = _check_stream(body)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise InvalidRequest(
            "Only response_format {\"type\": \"text\"} is supported.", param="response_format"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of {role, content}.", param="messages")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object with role and content.", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role is {show(role)}; supported roles: {', '.join(ROLES)}.", param="messages"
            )
        if message.get("tool_calls"):
            raise InvalidRequest("Tool calls are not supported by this server.", param="messages")
        chat.append({"role": ROLES[role], "content": _message_text(message, i)})
    if not any(m["content"].strip() for m in chat):
        raise InvalidRequest("All messages are empty: send some text.", param="messages")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    # OpenAI's default is "as much as fits" (None): the service resolves it against the
    # server's limit and the room left in the context.
    params = parse_sampling(
        _sampling_body(body, max_tokens), max_new_tokens=max_new_tokens,
        default_max_tokens=None, default_temperature=OPENAI_DEFAULT_TEMPERATURE,
    )
    return OpenAIRequest(Request(prompt="", messages=chat, params=params), model, stream, include_usage)


def _finish_reason(result: RequestResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def _usage(result: RequestResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


class Shaper:
    """Builds the response objects of one request (completion or chat, whole or chunked)."""

    def __init__(self, chat: bool, request_id: str, model: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id.removeprefix("req-")
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _base(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + ".chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def whole(self, result: RequestResult) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish_reason(result), "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        return {**self._base(False), "choices": [choice], "usage": _usage(result)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = {**self._base(True), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def last_chunk(self, result: RequestResult) -> dict[str, Any]:
        return self.chunk(None if self.chat else "", _finish_reason(result))

    def usage_chunk(self, result: RequestResult) -> dict[str, Any]:
        return {**self._base(True), "choices": [], "usage": _usage(result)}
