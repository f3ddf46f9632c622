"""Anthropic's Messages API (``POST infer/v1/messages`` and ``.../count_tokens``): a translator.

A Messages body becomes the OpenAI chat body it means (llama.cpp's
``server_chat_convert_anthropic_to_oai``): ``system`` as the first message, content blocks as
text parts, ``tool_use`` blocks as ``tool_calls``, ``tool_result`` blocks as ``tool`` messages,
``tools`` and ``tool_choice`` as OpenAI's, ``stop_sequences`` as ``stop``. That body is parsed by
the chat route's own parser, so the request, its chat template, tools and constraints are the
chat route's. The answer (``RequestResult``, or ``TokenEvent`` pieces as they stream) is
rendered back as a message: ``thinking``, ``text`` and ``tool_use`` blocks, or the stream's
``message_start`` … ``content_block_*`` … ``message_delta``, ``message_stop`` events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest, UnknownModel
from ..values.answer import AnswerPiece
from ..values.engine_info import EngineInfo
from ..values.request import Request, RequestResult, show
from .openai_requests import chat_to_render, parse_chat

# Fields acted on; the rest are accepted and named in the answer's X-Ignored-Fields header.
MESSAGES_FIELDS = {"model", "max_tokens", "system", "messages", "tools", "tool_choice", "stop_sequences",
                   "temperature", "top_p", "top_k", "metadata", "thinking", "stream", "output_config",
                   "output_format", "chat_template_kwargs"}
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "stream")
_SKIPPED_BLOCKS = {"thinking", "redacted_thinking"}  # an earlier turn's reasoning: not read again
# Our parsers' names for what this dialect calls otherwise (in their error messages).
_NAMES = {"'stop'": "'stop_sequences'", "'response_format'": "'output_config.format'",
          "'parallel_tool_calls'": "'tool_choice.disable_parallel_tool_use'"}
_PARAMS = {"stop": "stop_sequences", "response_format": "output_config", "parallel_tool_calls": "tool_choice"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
                413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
Event = tuple[str, dict[str, Any]]  # an SSE event's name and its data


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells them (``toolu_…``; ours are OpenAI's ``call_…``)."""
    return "toolu_" + call_id.removeprefix("call_")


@dataclass
class MessagesCall:
    """A parsed ``v1/messages`` call: the one request, and how to shape its answer."""

    request: Request
    model: str
    stream: bool = False
    ignored: list[str] = field(default_factory=list)


def _fail(message: str, param: str = "messages") -> InvalidRequest:
    return InvalidRequest(message, param=param)


# -- in: a Messages body as the chat body it means ------------------------------------------------
def _text(block: Mapping[str, Any], where: str) -> dict[str, str]:
    if not isinstance(block.get("text"), str):
        raise _fail(f"{where}: a text block's 'text' must be a string.")
    return {"type": "text", "text": block["text"]}


def _texts(value: Any, where: str) -> str | list[dict[str, str]]:
    """A string, or text blocks as OpenAI's text parts (``system``, a ``tool_result``'s content)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _fail(f"{where} must be a string or a list of text blocks.")
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else block
            raise _fail(f"{where}[{j}]: only text blocks are supported here; got {show(kind)}.")
        parts.append(_text(block, f"{where}[{j}]"))
    return parts


def _tool_use(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _fail(f"{where}: a tool_use block needs an 'id' and a 'name' (strings).")
    if not isinstance(block.get("input", {}), dict):
        raise _fail(f"{where}: a tool_use block's 'input' must be an object.")
    arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _fail(f"{where}: a tool_result block needs the 'tool_use_id' of the call it answers.")
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _texts(block.get("content"), where)}


def _turn(role: str, content: list[Any], i: int) -> list[dict[str, Any]]:
    """One message's blocks as chat messages, in order: its text (and calls), each tool result
    its own ``tool`` message."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    allowed = {"text", "tool_use", *_SKIPPED_BLOCKS} if role == "assistant" else {"text", "tool_result"}
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise _fail(f"{where}: {show(kind)} blocks are not supported in a {role} message here; "
                        f"send {', '.join(sorted(allowed - _SKIPPED_BLOCKS))}.")
        if kind == "text":
            parts.append(_text(block, where))
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind == "tool_result":
            if parts:
                out.append({"role": role, "content": parts})
                parts = []
            out.append(_tool_result(block, where))
    if role == "assistant":
        return [{"role": role, "content": parts or "", **({"tool_calls": calls} if calls else {})}]
    return out + ([{"role": role, "content": parts}] if parts or not out else [])


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list of {role, content}.")
    out = []
    system = _texts(body.get("system"), "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            role = message.get("role") if isinstance(message, dict) else message
            raise _fail(f"messages[{i}].role must be 'user' or 'assistant' (the system prompt is the top-level "
                        f"'system'); got {show(role)}.")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out += _turn(message["role"], content, i)
        else:
            raise _fail(f"messages[{i}].content must be a string or a list of content blocks.")
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail("'tools' must be a list of {name, description, input_schema}.", "tools")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise _fail(f"tools[{i}] is {show(kind)}: only custom tools ({{name, description, input_schema}}) "
                        "are supported; the tools Anthropic runs on its own servers are not.", "tools")
        out.append({"type": "function", "function": {
            "name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("input_schema")}})
    return out


def _tool_choice(value: Any, has_tools: bool) -> tuple[Any, bool | None]:
    """Anthropic's ``tool_choice`` as OpenAI's, and ``parallel_tool_calls`` (None: as default)."""
    kind = value.get("type") if isinstance(value, dict) else None
    choice: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool" and isinstance(value.get("name"), str):
        choice = {"type": "function", "function": {"name": value["name"]}}
    if choice is None:
        raise _fail("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                    f"{{\"type\": \"tool\", \"name\": ...}}; got {show(value)}.", "tool_choice")
    if kind in ("any", "tool") and not has_tools:
        raise _fail(f"'tool_choice' is {kind!r}, but the request has no 'tools'.", "tool_choice")
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise _fail("'tool_choice.disable_parallel_tool_use' must be true or false.", "tool_choice")
    return choice, None if parallel is None else not parallel


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``thinking`` as the chat template's ``enable_thinking`` (Qwen3 reads it; other templates
    do not), beside any ``chat_template_kwargs`` sent (they win)."""
    kwargs = body.get("chat_template_kwargs")
    thinking = body.get("thinking")
    if thinking is None:
        return kwargs
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        raise _fail("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"adaptive\"} "
                    "or {\"type\": \"disabled\"}.", "thinking")
    if not isinstance(kwargs, (dict, type(None))):
        return kwargs  # the chat parser says what is wrong with it
    return {"enable_thinking": thinking["type"] != "disabled", **(kwargs or {})}


def _output_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` (a JSON schema; the structured outputs beta sent it as
    ``output_format``) as ``response_format``: grammar-constrained."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    fmt = body.get("output_format") if fmt is None else fmt
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _fail("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}.", "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_body(body: Any, *, counting: bool = False) -> dict[str, Any]:
    """A Messages body as the OpenAI chat body it means (``counting``: a ``count_tokens``
    body, which has no ``max_tokens``)."""
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object with 'model', 'max_tokens' and 'messages'.", "body")
    out: dict[str, Any] = {"messages": _messages(body)}
    if "model" in body:
        out["model"] = body["model"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"], parallel = _tool_choice(body["tool_choice"], bool(out.get("tools")))
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
    kwargs = _template_kwargs(body)
    if kwargs is not None:
        out["chat_template_kwargs"] = kwargs
    if counting:
        return out
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _fail(f"'max_tokens' is required: the most tokens the answer may have (an integer of 1 or more, "
                    f"e.g. 1024); got {show(max_tokens)}.", "max_tokens")
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _fail("'stop_sequences' must be a list of strings.", "stop_sequences")
    out |= {name: body[name] for name in _SAMPLING if name in body} | ({"stop": stop} if stop else {})
    response_format = _output_format(body)
    if response_format is not None:
        out["response_format"] = response_format
    return out


def _in_our_words(err: InvalidRequest) -> InvalidRequest:
    """An error of the chat parser, naming the fields as this dialect names them."""
    for ours, theirs in _NAMES.items():
        err.message = err.message.replace(ours, theirs)
    err.args = (err.message,)
    err.param = _PARAMS.get(err.param or "", err.param)
    return err


def parse_call(body: Any, info: EngineInfo, *, max_new_tokens: int) -> MessagesCall:
    """``POST infer/v1/messages`` → the chat route's ``Request``; raises ``InvalidRequest``
    (or ``UnknownModel``) before anything is queued."""
    chat = chat_body(body)
    try:
        call = parse_chat(chat, info, max_new_tokens=max_new_tokens, max_choices=1)
    except InvalidRequest as err:
        raise _in_our_words(err) from None
    return MessagesCall(call.requests[0], call.model, call.stream, sorted(set(body) - MESSAGES_FIELDS))


def count_request(body: Any, info: EngineInfo) -> Request:
    """``POST infer/v1/messages/count_tokens`` → the request whose prompt to count."""
    chat = chat_body(body, counting=True)
    model = chat.get("model")
    if model is not None and model not in info.model_names():
        raise UnknownModel(f"The model {show(model)} is not served here; use {info.model_names()[0]!r} "
                           "(see GET infer/v1/models).", param="model")
    try:
        return chat_to_render(chat)
    except InvalidRequest as err:
        raise _in_our_words(err) from None


# -- out: the answer as a message --------------------------------------------------------------
def message_id(request_id: str) -> str:
    return "msg_" + request_id.removeprefix("req-")


def stop_reason(result: RequestResult) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``: ``max_tokens``, ``tool_use`` (the answer is calls,
    to the named tool too), ``stop_sequence`` (which one), or ``end_turn``."""
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.tool_calls:
        return "tool_use", None
    if result.stop_sequence is not None:
        return "stop_sequence", result.stop_sequence
    return "end_turn", None


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}  # not reached for a whole call: its grammar made it JSON


def content_blocks(result: RequestResult) -> list[dict[str, Any]]:
    """``thinking``, then ``text``, then a ``tool_use`` per whole call (one cut short by
    ``max_tokens`` is left out: it is not callable)."""
    blocks: list[dict[str, Any]] = []
    if result.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.content:
        blocks.append({"type": "text", "text": result.content})
    for call in (result.tool_calls or ())[: result.whole_calls]:
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": fn["name"], "input": _input(fn["arguments"])})
    return blocks


def message(result: RequestResult, request_id: str, model: str) -> dict[str, Any]:
    """The whole answer as a message."""
    reason, sequence = stop_reason(result)
    return {"id": message_id(request_id), "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(result), "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}}


class MessageEvents:
    """The stream's events for one answer: ``start``, then ``pieces`` as they come (a change of
    kind closes the open block and opens the next; each call is its own ``tool_use`` block), then
    ``end``."""

    _BLOCKS = {"reasoning": ("thinking", {"thinking": "", "signature": ""}), "content": ("text", {"text": ""})}

    def __init__(self, request_id: str, model: str, input_tokens: int) -> None:
        self.id, self.model, self.input_tokens = message_id(request_id), model, input_tokens
        self.blocks = 0  # blocks opened so far: the open one's index is blocks - 1
        self.open: tuple[str, int] | None = None  # the open block's piece kind, and its call's index

    def start(self) -> list[Event]:
        shell = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                 "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": shell}), ("ping", {"type": "ping"})]

    def pieces(self, pieces: tuple[AnswerPiece, ...]) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if not piece.text and not piece.opens_call:
                continue
            if piece.opens_call or self.open is None or self.open != (piece.kind, piece.index):
                events += self._close()
                events.append(self._open(piece))
            if piece.text:
                events.append(self._delta(piece))
        return events

    def end(self, result: RequestResult) -> list[Event]:
        reason, sequence = stop_reason(result)
        return [*self._close(),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": {"output_tokens": result.completion_tokens}}),
                ("message_stop", {"type": "message_stop"})]

    def _open(self, piece: AnswerPiece) -> Event:
        if piece.kind == "call":
            block = {"type": "tool_use", "id": tool_use_id(piece.call_id or str(self.blocks)), "name": piece.name or "",
                     "input": {}}
        else:
            kind, empty = self._BLOCKS[piece.kind]
            block = {"type": kind, **empty}
        self.open = (piece.kind, piece.index)
        self.blocks += 1
        return "content_block_start", {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}

    def _delta(self, piece: AnswerPiece) -> Event:
        delta = {"reasoning": {"type": "thinking_delta", "thinking": piece.text},
                 "content": {"type": "text_delta", "text": piece.text},
                 "call": {"type": "input_json_delta", "partial_json": piece.text}}[piece.kind]
        return "content_block_delta", {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]


# -- errors ----------------------------------------------------------------------------------
def error_json(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape (the SDK picks its exception by the status)."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
