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

from ...constraints.tools import call_text
from ...values.request import Request, message_text

__all__ = ["asked", "simulated_turn"]

# Backticks and double quotes, not single ones: an apostrophe (don't, it's) is not a quote.
_QUOTED = re.compile(r"`([^`\n]+)`|\"([^\"\n]+)\"")


def simulated_turn(request: Request) -> tuple[str | None, bool]:
    """The call the simulated engine writes for ``request``, as its model would (None: text),
    and whether its row reads its whole answer out: a call, or a text beside tools (the cap
    on a run of answer tokens keeps strings in a schema short, not a chat's text)."""
    constraint = request.params.constraint
    if constraint is None or constraint.kind != "tools":
        return None, False
    tools = constraint.tools
    messages = request.wire_messages or request.messages or []
    last = messages[-1] if messages else {}
    said = message_text(last) if last.get("role") == "user" else ""
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
        return None, tools.text_schema is None
    tool = next(t for t in tools.tools if t.name == name)
    words = (w for w in _quoted(said) if w not in names)
    return call_text(name, _arguments(tool.parameters, words), tools.tool_format), True


def asked(request: Request) -> str:
    """What a request asks: a chat's last user message (its system prompt and tools, often
    thousands of words about something else, do not steer the answer), else its prompt."""
    said = [m for m in request.wire_messages or request.messages or [] if m.get("role") == "user"]
    return (message_text(said[-1]) if said else "") or request.prompt


def _quoted(said: str) -> Iterator[str]:
    for match in _QUOTED.finditer(said):
        yield next(g for g in match.groups() if g is not None)


def _arguments(schema: dict[str, Any], words: Iterator[str]) -> str:
    """The required string parameters, in the schema's order, filled from ``words`` (the
    grammar writes whatever else the schema asks)."""
    properties = schema.get("properties") or {}
    needed = set(schema.get("required") or ())
    required = [k for k in properties if k in needed]
    values = {}
    for key in required:
        if properties[key].get("type") != "string":
            break  # the grammar fills the rest, in order, from here
        values[key] = next(words, "")
    return json.dumps(values, separators=(", ", ": "))
