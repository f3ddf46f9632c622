"""OpenAI's Responses API (``POST infer/v1/responses``): a translator.

A Responses body becomes the chat body it means (llama.cpp's
``server_chat_convert_responses_to_chatcmpl``): ``instructions`` as the first system message,
``input`` items as messages (``message`` items, ``function_call`` items as an assistant's
``tool_calls``, ``function_call_output`` items as ``tool`` messages), the flat function
``tools`` as OpenAI chat's, ``text.format`` as ``response_format``, ``max_output_tokens`` as
``max_tokens``. A stored conversation (``previous_response_id``) comes first, as items. That
body is parsed by the chat route's own parser, so the request, its template, tools and
constraints are the chat route's. The answer (``RequestResult``) is rendered back as a
``response`` object with ``reasoning``, ``message`` and ``function_call`` output items; the
stream's events are in ``responses_events``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InferError, InvalidRequest
from ..values.engine_info import EngineInfo
from ..values.request import Request, RequestResult, show
from .fields import SAMPLING_FIELDS
from .openai_requests import parse_chat

# Fields acted on, or accepted knowing they change nothing here; the rest are named in the
# answer's X-Ignored-Fields header.
_EXTRAS = SAMPLING_FIELDS - {"max_tokens", "stop"}  # vLLM's sampling extras (extra_body)
RESPONSES_FIELDS = _EXTRAS | {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
    "temperature", "top_p", "reasoning", "stream", "stream_options", "store", "previous_response_id", "metadata",
    "user", "include", "truncation", "service_tier", "safety_identifier", "prompt_cache_key", "chat_template_kwargs",
    "background"}
_REFUSED = {"conversation": "conversations are not kept here; chain answers with 'previous_response_id'",
            "prompt": "stored prompt templates are not kept here; send 'instructions' and 'input'"}
_SKIPPED_ITEMS = {"reasoning"}  # an earlier turn's reasoning: accepted, not shown to the model again
_TEXT_PARTS = {"input_text", "output_text", "text"}
# Our parsers' names for what this dialect calls otherwise (in their error messages).
_NAMES = {"'max_tokens'": "'max_output_tokens'", "'response_format'": "'text.format'", "'messages'": "'input'"}
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}


@dataclass
class ResponsesCall:
    """A parsed ``v1/responses`` call: the one request, what its answer echoes back, and the
    conversation it continues (``items``: the stored items before it, then its own input)."""

    request: Request
    model: str
    stream: bool
    store: bool
    echo: dict[str, Any]  # the response object's fields that say how it was asked
    items: list[dict[str, Any]]
    ignored: list[str] = field(default_factory=list)
    continued: int = 0  # how many of ``items`` are stored ones (``previous_response_id``'s)

    @property
    def own_items(self) -> list[dict[str, Any]]:
        """The items this call sent itself (its ``input``)."""
        return self.items[self.continued:]


def _fail(message: str, param: str = "input") -> InvalidRequest:
    return InvalidRequest(message, param=param)


# -- in: the input items as chat messages ----------------------------------------------------------
def input_items(value: Any) -> list[dict[str, Any]]:
    """``input``: a string (one user message) or a list of items, as items."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _fail(f"'input' must be a string or a list of items (messages, function calls and their outputs); "
                    f"got {show(value)}.")
    return list(value)


def _text(content: Any, where: str) -> str:
    """A message's (or a call output's) content: a string, or text parts joined as written."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or a list of input_text parts.")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else part
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in (*_TEXT_PARTS, "refusal") or not isinstance(text, str):
            raise _fail(f"{where}.content[{j}] is {show(kind)}: only text parts (input_text, output_text) are "
                        "supported here, not images, files or audio.")
        texts.append(text)
    return "".join(texts)


def _call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise _fail(f"{where}: a function_call item needs 'call_id', 'name' and 'arguments' (strings).")
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise _fail(f"{where}.role must be 'user', 'system', 'developer' or 'assistant'; got {show(role)}.")
    return {"role": role, "content": _text(item.get("content"), where)}


def chat_messages(instructions: Any, items: list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
    """``instructions`` and the items as chat messages, in order (``first``: how many of the
    items are stored ones, before ``input``: errors name the input's own index). A call joins
    the assistant turn before it; each output is its own ``tool`` message."""
    out: list[dict[str, Any]] = []
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("'instructions' must be a string (the system prompt).", "instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        where = f"input[{i - first}]" if i >= first else f"the stored item {i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(_call(item, where))
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [_call(item, where)]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _fail(f"{where}: a function_call_output item needs the 'call_id' of the call it answers.")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item.get("output"), where)})
        elif kind not in _SKIPPED_ITEMS:
            raise _fail(f"{where} is a {show(kind)} item: supported are message, function_call and "
                        "function_call_output items (reasoning items are accepted and not read again).")
    if not out:
        raise _fail("'input' is required: a string, or a list of items.")
    return out


# -- in: tools, choices, format ------------------------------------------------------------------
def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail("'tools' must be a list of {\"type\": \"function\", \"name\", \"parameters\"}.", "tools")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise _fail(f"tools[{i}] is {show(kind)}: only function tools ({{\"type\": \"function\", \"name\", "
                        "\"parameters\"}) are supported; the tools OpenAI runs on its own servers are not.", "tools")
        out.append({"type": "function", "function": {
            "name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("parameters")}})
    return out


def _tool_choice(value: Any) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise _fail("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}; "
                f"got {show(value)}.", "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as the chat route's ``response_format`` (``json_schema``'s fields are
    flat here, nested there)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if not isinstance(text, dict) or (fmt is not None and kind not in ("text", "json_object", "json_schema")):
        raise _fail("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                    f"\"json_schema\", \"name\", \"schema\", \"strict\"}}; got {show(fmt if fmt else text)}.", "text")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _fail("'text.format' json_schema needs a 'schema' (a JSON schema object).", "text")
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}
    return {"type": kind} if kind == "json_object" else None


def _template_kwargs(body: Mapping[str, Any]) -> Any:
    """``reasoning.effort`` as the chat template's ``enable_thinking`` (Qwen3 reads it; other
    templates do not): ``none`` turns it off, any other effort on; ``chat_template_kwargs``
    sent beside it win."""
    kwargs, reasoning = body.get("chat_template_kwargs"), body.get("reasoning")
    if reasoning is None:
        return kwargs
    if not isinstance(reasoning, dict):
        raise _fail("'reasoning' must be an object such as {\"effort\": \"low\"}.", "reasoning")
    effort = reasoning.get("effort")
    if effort is None or not isinstance(kwargs, (dict, type(None))):
        return kwargs  # the chat parser says what is wrong with a bad one
    return {"enable_thinking": effort != "none", **(kwargs or {})}


def chat_body(body: Mapping[str, Any], history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A Responses body (after the stored items ``history``) as the chat body it means, and
    the conversation's items (``history``, then ``input``'s)."""
    for name, why in _REFUSED.items():
        if body.get(name) is not None:
            raise _fail(f"'{name}' is not supported: {why}.", name)
    if body.get("background"):
        raise _fail("'background' is not supported: send the request and wait for it (or stream it).", "background")
    items = history + (input_items(body["input"]) if body.get("input") is not None else [])
    out: dict[str, Any] = {"messages": chat_messages(body.get("instructions"), items, len(history))}
    out |= {name: body[name] for name in ("model", "stream", "temperature", "top_p", *_EXTRAS) if name in body}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    kwargs = _template_kwargs(body)
    if kwargs is not None:
        out["chat_template_kwargs"] = kwargs
    return out, items


def listed_item(item: dict[str, Any], index: int) -> dict[str, Any]:
    """A stored input item as ``input_items`` lists it: with an ``id``, a message's content as
    parts (a string was sent as one)."""
    out = {"id": f"item_{index}", **item}
    if out.get("type", "message") == "message" and "role" in out:
        out["type"] = "message"
        if isinstance(out.get("content"), str):
            kind = "output_text" if out["role"] == "assistant" else "input_text"
            out["content"] = [{"type": kind, "text": out["content"]}]
    return out


def in_our_words(err: InvalidRequest) -> InvalidRequest:
    """An error of the chat parser (or the service's checks), naming the fields as this
    dialect names them."""
    for ours, theirs in _NAMES.items():
        err.message = err.message.replace(ours, theirs)
    err.args = (err.message,)
    err.param = _PARAMS.get(err.param or "", err.param)
    return err


def _echo(body: Mapping[str, Any], request: Request) -> dict[str, Any]:
    """What the response object says of how it was asked: the tools in this dialect's shape,
    the sampling the request runs with."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    reasoning = body.get("reasoning") or {}
    return {
        "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "tools": [{"strict": None, "description": None, **t} for t in body.get("tools") or []],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": request.params.temperature, "top_p": request.params.top_p,
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "text": {"format": {"type": "text"}, **text},
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": body.get("store") is not False, "truncation": "disabled", "user": body.get("user"),
        "background": False, "service_tier": "default",
    }


def parse_call(body: Any, info: EngineInfo, history: list[dict[str, Any]], *, max_new_tokens: int) -> ResponsesCall:
    """``POST infer/v1/responses`` → the chat route's ``Request``; raises ``InvalidRequest``
    (or ``UnknownModel``) before anything is queued."""
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object with 'model' and 'input'.", "body")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise _fail("'store' must be true or false.", "store")
    chat, items = chat_body(body, history)
    try:
        call = parse_chat(chat, info, max_new_tokens=max_new_tokens, max_choices=1)
    except InvalidRequest as err:
        raise in_our_words(err) from None
    request = call.requests[0]
    return ResponsesCall(request, call.model, call.stream, store, _echo(body, request), items,
                         sorted(set(body) - RESPONSES_FIELDS), len(history))


# -- out: the answer as a response object ----------------------------------------------------------
def response_id(request_id: str) -> str:
    return "resp_" + request_id.removeprefix("req-")


def item_id(kind: str, request_id: str, index: int = 0) -> str:
    """An output item's id, the same in the stream and in the whole response: ``rs_``, ``msg_``,
    ``fc_`` (a call's by its place among the answer's calls)."""
    prefix = {"reasoning": "rs", "content": "msg", "call": "fc"}[kind]
    return f"{prefix}_{request_id.removeprefix('req-')}" + (f"_{index}" if kind == "call" else "")


def reasoning_item(request_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id("reasoning", request_id), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(request_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id("content", request_id), "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text)]}


def call_item(request_id: str, index: int, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"id": item_id("call", request_id, index), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(result: RequestResult, request_id: str) -> list[dict[str, Any]]:
    """``reasoning``, then the ``message``, or a ``function_call`` per call (one cut short by
    ``max_output_tokens`` marked ``incomplete``)."""
    cut = result.finish_reason == "length"
    items = [reasoning_item(request_id, result.reasoning)] if result.reasoning else []
    if result.tool_calls:
        for n, call in enumerate(result.tool_calls):
            fn = call["function"]
            items.append(call_item(request_id, n, call["id"], fn["name"], fn["arguments"],
                                   "completed" if n < result.whole_calls else "incomplete"))
    elif result.content is not None:
        items.append(message_item(request_id, result.content, "incomplete" if cut else "completed"))
    return items


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """``usage`` with the details the SDK's type requires (nothing is cached or counted apart
    here: a prefix cache hit is not reported per request, nor a reasoning model's share)."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


class ResponseShape:
    """The response object of one call, as it starts (``in_progress``) and as it ends."""

    def __init__(self, call: ResponsesCall, request_id: str, model: str) -> None:
        self.call, self.request_id, self.model = call, request_id, model
        self.id = response_id(request_id)
        self.created_at = int(time.time())

    def base(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "model": self.model,
                "status": status, "error": None, "incomplete_details": None, "output": output, "usage": None,
                **self.call.echo}

    def whole(self, result: RequestResult) -> dict[str, Any]:
        """The answer as a ``completed`` response, or ``incomplete`` (``max_output_tokens``)."""
        out = self.base("completed", output_items(result, self.request_id))
        if result.finish_reason == "length":
            out |= {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
        out["completed_at"] = int(time.time())
        out["usage"] = usage(result.prompt_tokens, result.completion_tokens)
        return out

    def failed(self, err: InferError, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The response a failure ended (a stream's last event)."""
        code = "rate_limit_exceeded" if err.status == 429 else "server_error"
        return {**self.base("failed", output), "error": {"code": code, "message": err.message}}
