"""The native API's request body (``POST infer/generate(_stream)``, the embedded client): a
``prompt`` or chat ``messages``, the sampling fields, and a constraint (``json_schema``,
``regex``, ``choice``, ``grammar``, or any OpenAI or vLLM spelling) or ``tools``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..constraints.spec import from_body
from ..errors import InvalidRequest
from ..values.request import Request, RequestResult
from ..values.stream import RequestStream
from .chat import parse_chat_and_tools
from .fields import parse_generate_body

CHAT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls")


def parse_generate(body: Any, *, max_new_tokens: int) -> Request:
    """A native body as a ``Request``; ``InvalidRequest`` for what it cannot be. With
    ``messages`` (and, optionally, ``tools``), the service renders the chat; the answer's
    text holds any tool calls in the tool format (``constraints/tools.py``)."""
    constraint = from_body(body, native=True) if isinstance(body, dict) else None
    if isinstance(body, dict) and "messages" in body:
        if "prompt" in body:
            raise InvalidRequest("Send 'prompt' or 'messages', not both.", param="prompt")
        rest = {k: v for k, v in body.items() if k not in CHAT_FIELDS}
        request = parse_generate_body({**rest, "prompt": "chat"}, max_new_tokens=max_new_tokens)
        chat, wire, constraint = parse_chat_and_tools(body, constraint)
        request = replace(request, prompt="", messages=chat, wire_messages=wire)
    else:
        if isinstance(body, dict) and any(k in body for k in CHAT_FIELDS[1:]):
            raise InvalidRequest("'tools' need chat 'messages' (not a 'prompt').", param="tools")
        request = parse_generate_body(body, max_new_tokens=max_new_tokens)
    if constraint is None:
        return request
    return replace(request, params=replace(request.params, constraint=constraint))


def native_answer(result: RequestResult, request: Request, stream: RequestStream) -> dict[str, Any]:
    """A native answer (``infer/generate``, the stream's ``result`` event, the embedded
    client's): the result, the model that wrote it (``simulated``: no model, the cell says so),
    and ``tool_format`` (how its text writes tool calls: the model's family,
    ``constraints/tool_formats``) where the request offered tools."""
    answer = {**result.to_json(), "model": stream.model}
    constraint = request.params.constraint
    if constraint is not None and constraint.kind == "tools":
        answer["tool_format"] = stream.tool_format
    return answer
