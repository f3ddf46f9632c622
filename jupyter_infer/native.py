"""The native API's request body (``POST infer/generate(_stream)``, the embedded client): a
``prompt`` or chat ``messages``, the sampling fields, and a constraint (``json_schema``,
``regex``, ``choice``, ``grammar``, or any OpenAI or vLLM spelling) or ``tools``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .chat import parse_messages, with_tools
from .constraints.spec import from_body
from .constraints.tools import ToolSet
from .errors import InvalidRequest
from .request import Request, parse_generate_body

CHAT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls")


def parse_generate(body: Any, *, max_new_tokens: int) -> Request:
    """A native body as a ``Request``; ``InvalidRequest`` for what it cannot be. With
    ``messages`` (and, optionally, ``tools``), the service renders the chat; the answer's
    text holds any tool calls in the tool format (``constraints/tools.py``)."""
    if isinstance(body, dict) and "messages" in body:
        if "prompt" in body:
            raise InvalidRequest("Send 'prompt' or 'messages', not both.", param="prompt")
        rest = {k: v for k, v in body.items() if k not in CHAT_FIELDS}
        request = parse_generate_body({**rest, "prompt": "chat"}, max_new_tokens=max_new_tokens)
        chat, tools = parse_messages(body), ToolSet.from_body(body)
        request = replace(request, prompt="", messages=with_tools(chat, tools) if tools else chat)
    else:
        if isinstance(body, dict) and any(k in body for k in CHAT_FIELDS[1:]):
            raise InvalidRequest("'tools' need chat 'messages' (not a 'prompt').", param="tools")
        request, tools = parse_generate_body(body, max_new_tokens=max_new_tokens), None
    constraint = from_body(body, native=True)
    if tools is not None:
        if constraint is not None:
            raise InvalidRequest("A request with tools cannot also constrain its text: send one or the other.",
                                 param="tools")
        constraint = tools.constraint()
    if constraint is None:
        return request
    return replace(request, params=replace(request.params, constraint=constraint))
