"""What the simulated engine answers a chat: about its user's last message, and when it calls
a tool: an agent loop, deterministic, with no model.

A chat that offers tools gets a call when its last message is the user's and names one of
them (``auto``), or whenever a call is due (``required``, a named tool): the call's string
arguments are the message's backticked or double-quoted words, in order (``write `notes.txt`
"hello"`` → ``write(file_path="notes.txt", content="hello")``). After a tool's result, or
when no tool is named, it answers in text as it always does. The grammar still decides every
token, so a call always fits its tool's schema; this only chooses what the engine reads out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from ..constraints.tools import ToolSet, call_text
from ..values.request import Request

__all__ = ["asked", "reads_whole", "simulated_call"]

# Backticks and double quotes, not single ones: an apostrophe (don't, it's) is not a quote.
_QUOTED = re.compile(r"`([^`\n]+)`|\"([^\"\n]+)\"")


def simulated_call(request: Request) -> str | None:
    """The call the simulated engine writes for ``request``, as its model would; None: text."""
    constraint = request.params.constraint
    if constraint is None or constraint.kind != "tools":
        return None
    tools = ToolSet.from_constraint(constraint)
    messages = request.wire_messages or request.messages or []
    last = messages[-1] if messages else {}
    said = _text(last.get("content")) if last.get("role") == "user" else ""
    names = [t.name for t in tools.tools]
    named = [n for _, n in sorted((m.start(), n) for n in names
                                  for m in [re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", said)] if m)]
    if tools.named:
        name = tools.choice
    elif named:
        name = named[0]
    elif tools.choice == "required":
        name = names[0]
    else:
        return None
    tool = next(t for t in tools.tools if t.name == name)
    words = (w for w in _quoted(said) if w not in names)
    return call_text(name, _arguments(tool.parameters, words), tools.tool_format)


def asked(request: Request) -> str:
    """What a request asks: a chat's last user message (its system prompt and tools, often
    thousands of words about something else, do not steer the answer), else its prompt."""
    said = [m for m in request.wire_messages or request.messages or [] if m.get("role") == "user"]
    return (_text(said[-1].get("content")) if said else "") or request.prompt


def reads_whole(request: Request) -> bool:
    """Whether a constrained row reads its whole answer out: a call, or a text beside tools
    (the answer's cap on a run of tokens keeps strings in a schema short, not a chat's text)."""
    constraint = request.params.constraint
    return constraint is not None and constraint.kind == "tools" and ToolSet.from_constraint(constraint).text_schema is None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _quoted(said: str) -> Iterator[str]:
    for match in _QUOTED.finditer(said):
        yield next(g for g in match.groups() if g is not None)


def _arguments(schema: dict[str, Any], words: Iterator[str]) -> str:
    """The required string parameters, in the schema's order, filled from ``words`` (the
    grammar writes whatever else the schema asks)."""
    properties = schema.get("properties") or {}
    required = [k for k in properties if k in set(schema.get("required") or ())]
    values = {}
    for key in required:
        if properties[key].get("type") != "string":
            break  # the grammar fills the rest, in order, from here
        values[key] = next(words, "")
    return json.dumps(values, separators=(", ", ": "))
