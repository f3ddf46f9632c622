"""Ollama's ``api/chat`` and ``api/generate`` bodies (under ``infer/api/``): a translator in.

A chat body becomes the OpenAI chat body it means: ``messages`` (``images`` refused, an earlier
turn's ``thinking`` dropped, ``tool_calls`` with their arguments as JSON text, a ``tool``
message's ``tool_name`` matched to its call), ``tools`` as sent (Ollama's are OpenAI's),
``format`` as ``response_format`` (``"json"``, or a JSON schema: grammar-constrained),
``options`` as the sampling fields (``num_predict`` is ``max_tokens``, ``repeat_penalty`` is
``repetition_penalty``), ``think`` as the template's ``enable_thinking``; the chat route's own
parser reads it. A generate body is that chat with one user turn (and ``system``), or, ``raw``
or with a ``suffix`` (infill), the completions body it means, read by the completions parser.
The answers are rendered in ``ollama_answers``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InferError, InvalidRequest
from ..values.engine_info import EngineInfo
from ..values.request import Request, show
from .openai_requests import OpenAIRequest, parse_chat, parse_completion

# Fields acted on; the rest are accepted and named in the answer's X-Ignored-Fields header.
CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"}
GENERATE_FIELDS = {"model", "prompt", "suffix", "system", "raw", "images", "format", "options", "stream",
                   "keep_alive", "think"}
# Ollama's options → the sampling fields every route reads (wire/fields.py).
_OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
# Our parsers' names for what this dialect calls otherwise (in their error messages).
_NAMES = {f"'{ours}'": f"'options.{theirs}'" for theirs, ours in _OPTIONS.items()} | {
    "'response_format'": "'format'", "'chat_template_kwargs'": "'think'"}
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+")
_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ModelBusy(InferError):
    """``keep_alive: 0`` asked to unload a model that others' requests still use."""

    status = 409
    code = "model_busy"


@dataclass
class OllamaCall:
    """A parsed ``api/chat`` or ``api/generate`` call: the one request (``None``: the body asks
    only to load the model, or with ``keep_alive: 0`` to unload it), and how to answer."""

    request: Request | None
    model: str  # as the client named it: every answer echoes it
    chat: bool
    stream: bool = True
    keep_alive_s: float | None = None  # None: not sent; 0: unload after the answer
    ignored: list[str] = field(default_factory=list)


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


# -- the fields both routes share ------------------------------------------------------------
def model_name(body: Any) -> str:
    """The model the body names (Ollama requires it)."""
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object with 'model'.", "body")
    name = body.get("model")
    if not isinstance(name, str) or not name.strip():
        raise _fail("model is required: name a model that GET api/tags lists.", "model")
    return name


def name_candidates(name: str) -> list[str]:
    """The names ``name`` may stand for, in order: as sent, then Ollama's default tag dropped
    (``tiny:latest`` is ``tiny``) or added (``llama3.2`` is ``llama3.2:latest``)."""
    out = [name]
    if name.endswith(":latest"):
        out.append(name.removesuffix(":latest"))
    elif ":" not in name.rsplit("/", 1)[-1]:
        out.append(name + ":latest")
    return out


def keep_alive(value: Any) -> float | None:
    """``keep_alive`` in seconds: a number of seconds, or a Go duration (``"5m"``, ``"1h30m"``,
    ``"0"``); negative means forever (``inf``)."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = sign * float(text)
        except ValueError:
            if _DURATION.fullmatch(text):
                seconds = sign * sum(float(n) * _UNITS_S[u] for n, u in re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text))
    if seconds is None or seconds != seconds:
        raise _fail(f"'keep_alive' must be a number of seconds or a duration such as \"5m\" or \"0\"; "
                    f"got {show(value)}.", "keep_alive")
    return float("inf") if seconds < 0 else seconds


def only_model(body: Mapping[str, Any], chat: bool) -> bool:
    """Whether the body asks only for the model (Ollama's idiom: no messages, or no prompt)."""
    return not body.get("messages") if chat else not body.get("prompt")


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is None:
        return True  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise _fail("'stream' must be true or false.", "stream")
    return stream


def _options(body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``options`` as sampling fields, and the options not acted on (``options.num_ctx``: the
    context is the model's)."""
    options = body.get("options")
    if options is None:
        return {}, []
    if not isinstance(options, dict):
        raise _fail("'options' must be an object such as {\"temperature\": 0, \"num_predict\": 64}.", "options")
    fields: dict[str, Any] = {}
    for name, value in options.items():
        if name in _OPTIONS and value is not None:
            fields[_OPTIONS[name]] = value
    if isinstance(fields.get("max_tokens"), int) and not isinstance(fields["max_tokens"], bool) \
            and fields["max_tokens"] < 0:
        del fields["max_tokens"]  # -1 (no limit) and -2 (fill the context): as much as fits
    return fields, [f"options.{name}" for name in options if name not in _OPTIONS]


def _format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``format`` as ``response_format``: ``"json"`` (any JSON object) or a JSON schema."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}
    raise _fail(f"'format' must be \"json\" or a JSON schema (an object); got {show(fmt)}.", "format")


def _think(body: Mapping[str, Any], info: EngineInfo) -> dict[str, Any] | None:
    """``think`` as the chat template's ``enable_thinking`` (and a level as its
    ``reasoning_effort``); like Ollama, asking a model that does not reason to think is a 400."""
    think = body.get("think")
    if think is None:
        return None
    if think not in (True, False, "high", "medium", "low"):
        raise _fail(f"'think' must be true, false, \"high\", \"medium\" or \"low\"; got {show(think)}.", "think")
    if think is not False and not info.reasoning:
        raise _fail(f"{show(body.get('model'))} does not support thinking (it writes no reasoning section); "
                    "leave 'think' out.", "think")
    return {"enable_thinking": think is not False, **({"reasoning_effort": think} if isinstance(think, str) else {})}


def _no_images(value: Any, where: str) -> None:
    if value:
        raise _fail(f"{where}: images are not supported here: this server runs text models. "
                    "Send the text alone.", where.split("[")[0])


def _openai_fields(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """What a chat and a generate body both carry, as the OpenAI body's fields."""
    sampling, _ = _options(body)
    out: dict[str, Any] = {"model": model, "stream": _stream(body), **sampling}
    response_format = _format(body)
    if response_format is not None:
        out["response_format"] = response_format
    return out


def _in_our_words(err: InvalidRequest) -> InvalidRequest:
    """An error of the OpenAI parsers, naming the fields as this dialect names them."""
    for ours, theirs in _NAMES.items():
        err.message = err.message.replace(ours, theirs)
    err.args = (err.message,)
    return err


def _parsed(parse: Any, body: dict[str, Any], info: EngineInfo, max_new_tokens: int) -> OpenAIRequest:
    try:
        return parse(body, info, max_new_tokens=max_new_tokens, max_choices=1)
    except InvalidRequest as err:
        raise _in_our_words(err) from None


def _ignored(body: Mapping[str, Any], acted_on: set[str], alive: float | None) -> list[str]:
    ignored = sorted(set(body) - acted_on) + _options(body)[1]
    if alive not in (None, 0.0):
        ignored.append("keep_alive")  # the idle unload is the server's (InferApp.unload_after_s), not per request
    return ignored


# -- in: a chat -----------------------------------------------------------------------------------
def _calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls`` as OpenAI's (arguments as JSON text, an id each)."""
    if not isinstance(calls, list):
        raise _fail(f"messages[{i}].tool_calls must be a list of {{\"function\": {{name, arguments}}}}.", "messages")
    out = []
    for n, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _fail(f"messages[{i}].tool_calls[{n}] needs a 'function' with a 'name'.", "messages")
        arguments = fn.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{n}"
        out.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": text}})
    return out


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's; a tool result answers the earliest open call of its
    ``tool_name`` (its id is what templates that number calls read)."""
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not yet answered
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _fail(f"messages[{i}] must be an object with 'role' and 'content'.", "messages")
        _no_images(message.get("images"), f"messages[{i}].images")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _fail(f"messages[{i}].content must be a string; got {show(content)}.", "messages")
        entry: dict[str, Any] = {"role": message.get("role"), "content": content or ""}
        if message.get("tool_calls"):
            entry["tool_calls"] = _calls(message["tool_calls"], i)
            open_calls = [(c["id"], c["function"]["name"]) for c in entry["tool_calls"]]
        if message.get("role") == "tool":
            name = message.get("tool_name") or message.get("name")
            match = next((c for c in open_calls if c[1] == name), open_calls[0] if open_calls else None)
            if match is not None:
                open_calls.remove(match)
                entry["tool_call_id"] = match[0]
            if isinstance(name, str):
                entry["name"] = name
            if isinstance(message.get("tool_call_id"), str):
                entry["tool_call_id"] = message["tool_call_id"]
        out.append(entry)
    return out


def parse_chat_call(body: Any, info: EngineInfo, model: str, *, max_new_tokens: int) -> OllamaCall:
    """``POST infer/api/chat`` → the chat route's ``Request`` (``model``: the served name the
    client's name stands for); raises ``InvalidRequest`` before anything is queued."""
    sent = model_name(body)
    alive = keep_alive(body.get("keep_alive"))
    stream = _stream(body)
    messages = body.get("messages")
    if messages is None or messages == []:
        return OllamaCall(None, sent, True, stream, alive)
    if not isinstance(messages, list):
        raise _fail("'messages' must be a list of {role, content}.", "messages")
    chat = _openai_fields(body, model) | {"messages": chat_messages(messages)}
    if body.get("tools") is not None:
        chat["tools"] = body["tools"]
    kwargs = _think(body, info)
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    call = _parsed(parse_chat, chat, info, max_new_tokens)
    return OllamaCall(call.requests[0], sent, True, stream, alive, _ignored(body, CHAT_FIELDS, alive))


# -- in: a generate -------------------------------------------------------------------------------
def _text_field(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _fail(f"'{name}' must be a string; got {show(value)}.", name)
    return value


def parse_generate_call(body: Any, info: EngineInfo, model: str, *, max_new_tokens: int) -> OllamaCall:
    """``POST infer/api/generate`` → the request it means: the prompt as one user turn of a
    chat (``system`` before it), or, ``raw`` or with a ``suffix``, the prompt as it is (an
    infill with a suffix: the completions route's)."""
    sent = model_name(body)
    alive = keep_alive(body.get("keep_alive"))
    stream = _stream(body)
    prompt, suffix, system = (_text_field(body, name) for name in ("prompt", "suffix", "system"))
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise _fail("'raw' must be true or false.", "raw")
    _no_images(body.get("images"), "images")
    if not prompt:
        return OllamaCall(None, sent, False, stream, alive)
    fields = _openai_fields(body, model)
    acted_on = set(GENERATE_FIELDS)
    if raw or suffix:
        acted_on -= {"system", "think"}  # a raw prompt is the model's whole input, as Ollama has it
        completion = fields | {"prompt": prompt, **({"suffix": suffix} if suffix else {})}
        request = _parsed(parse_completion, completion, info, max_new_tokens).requests[0]
        if "max_tokens" not in fields:  # the completions route's default is 16; Ollama's: as much as fits
            request = replace(request, params=replace(request.params, max_tokens=None))
    else:
        turns = [{"role": "system", "content": system}] if system else []
        chat = fields | {"messages": [*turns, {"role": "user", "content": prompt}]}
        kwargs = _think(body, info)
        if kwargs is not None:
            chat["chat_template_kwargs"] = kwargs
        request = _parsed(parse_chat, chat, info, max_new_tokens).requests[0]
    return OllamaCall(request, sent, False, stream, alive, _ignored(body, acted_on, alive))
