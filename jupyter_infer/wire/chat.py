"""Chat messages as the model reads them: OpenAI's message list (text parts, tool calls, tool
results) checked and flattened to ``{role, content}`` text for the chat template, and the
tools described in the system message. One place, for the OpenAI route and the native API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..constraints.tools import ToolSet, call_text
from ..errors import InvalidRequest
from ..values.request import Constraint, show

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "user", "function": "user"}  # a tool's result is the user's turn, in <tool_response>


def _message_text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
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


def _calls_text(calls: Any, index: int) -> list[str]:
    """An assistant message's ``tool_calls``, as the model wrote them (``tools.call_text``)."""
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
        out.append(call_text(fn["name"], arguments))
    return out


def with_tools(chat: list[dict[str, str]], tools: ToolSet) -> list[dict[str, str]]:
    """The tools described to the model in the system message (built-in format, any model)."""
    if chat[0]["role"] == "system":
        return [{"role": "system", "content": chat[0]["content"] + "\n\n" + tools.system_prompt()}, *chat[1:]]
    return [{"role": "system", "content": tools.system_prompt()}, *chat]


def parse_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """Chat ``messages`` as ``{role, content}`` text (roles mapped to the template's)."""
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
        text = _message_text(message, i)
        if role in ("tool", "function"):
            text = f"<tool_response>\n{text}\n</tool_response>"
            if chat and chat[-1]["content"].endswith("</tool_response>"):
                # Parallel calls' results are one user turn: templates that insist on
                # alternating roles refuse two user turns in a row.
                chat[-1]["content"] += "\n" + text
                continue
        elif role == "assistant" and message.get("tool_calls"):
            text = "\n".join([text, *_calls_text(message["tool_calls"], i)]).lstrip("\n")
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
