"""Chat messages as the model reads them: OpenAI's message list (text parts, tool calls, tool
results) checked, and either given to a chat template that renders tools itself (calls and
results as structured messages, ``tools=``) or flattened to ``{role, content}`` text with the
tools described in the system message in the model's call format. One place, for the OpenAI
route and the native API."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..constraints.tool_formats import HERMES, ToolFormat
from ..constraints.tools import ToolSet
from ..errors import InvalidRequest
from ..values.request import Constraint, Request, message_text, show

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "user", "function": "user"}  # a tool's result is the user's turn, in <tool_response>


def _calls(calls: Any, index: int) -> list[tuple[str, str]]:
    """An assistant message's ``tool_calls`` as ``(name, arguments)``, checked."""
    if not isinstance(calls, list):
        raise InvalidRequest(f"messages[{index}].tool_calls must be a list.", param="messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"messages[{index}].tool_calls: each call needs a function name.", param="messages")
        arguments = fn.get("arguments") or "{}"
        if not isinstance(arguments, str):
            raise InvalidRequest(f"messages[{index}].tool_calls: 'arguments' is a JSON string.", param="messages")
        out.append((fn["name"], arguments))
    return out


def with_tools(chat: list[dict[str, str]], tools: ToolSet) -> list[dict[str, str]]:
    """The tools described to the model in the system message (built-in format, any model)."""
    if chat[0]["role"] == "system":
        return [{"role": "system", "content": chat[0]["content"] + "\n\n" + tools.system_prompt()}, *chat[1:]]
    return [{"role": "system", "content": tools.system_prompt()}, *chat]


def parse_messages(body: Mapping[str, Any], fmt: ToolFormat = HERMES) -> list[dict[str, str]]:
    """Chat ``messages`` as ``{role, content}`` text (roles mapped to the template's; calls
    written back as the model writes them, in ``fmt``)."""
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
        text = message_text(message, i)
        if role in ("tool", "function"):
            text = f"<tool_response>\n{text}\n</tool_response>"
            if chat and chat[-1]["content"].endswith("</tool_response>"):
                # Parallel calls' results are one user turn: templates that insist on
                # alternating roles refuse two user turns in a row.
                chat[-1]["content"] += "\n" + text
                continue
        elif role == "assistant" and message.get("tool_calls"):
            text = "\n".join([text, fmt.calls(_calls(message["tool_calls"], i))]).lstrip("\n")
        chat.append({"role": ROLES[role], "content": text})
    if not any(m["content"].strip() for m in chat):
        raise InvalidRequest("All messages are empty: send some text.", param="messages")
    return chat


def parse_chat_and_tools(body: Mapping[str, Any], constraint: Constraint | None) -> tuple[
        list[dict[str, str]], list[dict[str, Any]] | None, Constraint | None]:
    """A chat body's messages and tools: the chat as the template reads it (tools described
    in the system message), the messages as sent where tools are involved (an upstream
    server gets those and the ``tools`` field, and renders them its own way; ``None``
    otherwise), and the answer's constraint (the tool set's, or ``constraint``)."""
    tools = ToolSet.from_body(body)
    chat = parse_messages(body)
    if tools is None:
        involved = any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") in ("tool", "function"))
                       for m in body["messages"])
        return chat, [dict(m) for m in body["messages"]] if involved else None, constraint
    if constraint is not None:
        tools = tools.answering_with(constraint)
    return with_tools(chat, tools), [dict(m) for m in body["messages"]], tools.constraint()


def template_messages(messages: list[dict[str, Any]], fmt: ToolFormat = HERMES) -> list[dict[str, Any]]:
    """Checked messages (``parse_messages`` has read them) as a chat template that renders
    tools reads them: calls as ``tool_calls`` with their arguments as objects (templates
    write them with ``tojson``), results as ``tool`` messages; call ids as the family's
    templates take them (Mistral's: nine alphanumerics, the same for a call and its result)."""

    def call_id(sent: Any) -> Any:
        if not fmt.id_length or not isinstance(sent, str):
            return sent
        return hashlib.sha256(sent.encode()).hexdigest()[: fmt.id_length]

    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role, text = message["role"], message_text(message, i)
        if role in ("tool", "function"):
            entry: dict[str, Any] = {"role": "tool", "content": text}
            for key in ("tool_call_id", "name"):
                if isinstance(message.get(key), str):
                    entry[key] = call_id(message[key]) if key == "tool_call_id" else message[key]
        elif role == "assistant" and message.get("tool_calls"):
            sent = message["tool_calls"]
            calls = [{"type": "function", "id": call_id(sent[n].get("id") or f"call_{i}_{n}"),
                      "function": {"name": name, "arguments": _arguments_value(arguments)}}
                     for n, (name, arguments) in enumerate(_calls(sent, i))]
            entry = {"role": "assistant", "content": text, "tool_calls": calls}
        else:
            entry = {"role": ROLES[role], "content": text}
        out.append(entry)
    return out


def _arguments_value(arguments: str) -> Any:
    """A call's arguments as an object where they are JSON (else the text as sent)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def chat_for_model(request: Request, fmt: ToolFormat, renders_tools: bool, specials: Mapping[str, int]) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]] | None, Constraint | None]:
    """A chat request as the model that runs it reads it: the messages to render, the tools
    its template renders (``None``: the template does not, or none were sent), and the
    answer's constraint, its calls in the model's format ``fmt``."""
    constraint = request.params.constraint
    tools = None
    if constraint is not None and constraint.kind == "tools":
        tools = constraint.tools.written_as(fmt, specials)
        if tools is not constraint.tools:  # the model writes calls its own way: a new set, its constraint
            constraint = tools.constraint()
    if request.wire_messages is None:  # no tools, no calls or results: the messages as parsed
        return list(request.messages or []), None, constraint
    if renders_tools:
        return template_messages(request.wire_messages, fmt), tools.openai_tools() if tools else None, constraint
    if fmt == HERMES:  # what the request was parsed into already (parse_chat_and_tools)
        return list(request.messages or []), None, constraint
    chat = parse_messages({"messages": request.wire_messages}, fmt)
    return (with_tools(chat, tools) if tools is not None else chat), None, constraint
