"""How each model family writes tool calls: the text around the calls and around each call,
the key its arguments go under, and how a chat template shows the family.

A call is a JSON object, the name first, laid out as the family's templates render one
(Jinja's ``tojson``: ``", "`` and ``": "``), so a trained model writes it as it learnt to:

- ``hermes`` (Qwen 2.5/3, Hermes, many others): ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``
- ``llama3_json`` (Llama 3.1–3.3): ``{"name": …, "parameters": …}``, one call per answer
- ``mistral``: ``[TOOL_CALLS][{"name": …, "arguments": …}, …]``
- ``granite`` (Granite 3.x): ``<|tool_call|>[{"name": …, "arguments": …}, …]``

A family's ``marker`` (Mistral's ``[TOOL_CALLS]``) is often a special token of its tokenizer:
the grammar then writes that token, not its spelling, and the decoded text leaves it out, so
the calls are read back with or without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest


@dataclass(frozen=True)
class ToolFormat:
    name: str
    marker: str = ""  # what opens an answer of calls, often a special token
    begin: str = ""  # before the first call, after the marker
    open: str = ""  # before each call
    close: str = ""  # after each call
    sep: str = ""  # between two calls
    end: str = ""  # after the last call
    arguments: str = "arguments"  # the key the arguments go under
    parallel: bool = True  # the family writes several calls in one answer
    # The length a call id must have in the family's templates (Mistral's: nine alphanumerics,
    # or the template raises); 0: any id.
    id_length: int = 0

    def call(self, name: str, arguments: str) -> str:
        """One call object, as the family writes it (``arguments``: JSON text)."""
        return '{"name": ' + json.dumps(name) + f', "{self.arguments}": ' + (arguments or "{}") + "}"

    def calls(self, calls: list[tuple[str, str]]) -> str:
        """An answer of ``(name, arguments)`` calls, as the model writes it."""
        body = self.sep.join(self.open + self.call(name, args) + self.close for name, args in calls)
        return self.marker + self.begin + body + self.end

    def head(self, name: str) -> str:
        """A call up to its arguments (a stream names the call at once)."""
        return '{"name": ' + json.dumps(name) + f', "{self.arguments}": '

    def first(self) -> str:
        """What every answer of calls starts with after its marker, up to the first name."""
        return self.begin + self.open + '{"name": "'

    def text_may_not_start(self) -> str:
        """The characters a text answer may not start with (they would start calls)."""
        return "".join(dict.fromkeys(s[0] for s in (self.marker, self.first()) if s))


HERMES = ToolFormat("hermes", open="<tool_call>\n", close="\n</tool_call>", sep="\n")
FORMATS = {f.name: f for f in (
    HERMES,
    ToolFormat("llama3_json", arguments="parameters", parallel=False, sep="; "),
    ToolFormat("mistral", marker="[TOOL_CALLS]", begin="[", sep=", ", end="]", id_length=9),
    ToolFormat("granite", marker="<|tool_call|>", begin="[", sep=", ", end="]"),
)}

# What in a chat template shows the family (its own rendering of a call), in this order.
_SIGNS = [("mistral", "[TOOL_CALLS]"), ("granite", "<|tool_call|>"), ("hermes", "<tool_call>"),
          ("llama3_json", '"parameters": ')]
_RENDERS_TOOLS = re.compile(r"\btools\b")


def named(name: str) -> ToolFormat:
    """The format called ``name`` (``InferApp.tool_call_format``)."""
    if name not in FORMATS:
        raise InvalidRequest(f"Unknown tool-call format {name!r}; known: {', '.join(FORMATS)}.")
    return FORMATS[name]


def of_template(template: str | None, configured: str = "") -> tuple[ToolFormat, bool]:
    """The tool format a chat template writes calls in, and whether the template renders the
    request's tools itself (``tools=``); ``configured`` (a format's name) when set wins.
    A template that renders tools in a format not known here gets the built-in prompt."""
    template = template or ""
    renders = bool(_RENDERS_TOOLS.search(template))
    if configured:
        return named(configured), renders
    for name, sign in _SIGNS:
        if sign in template:
            return FORMATS[name], renders
    return HERMES, False


def of_tokenizer(tokenizer: Any, configured: str = "") -> tuple[ToolFormat, bool, dict[str, int]]:
    """A checkpoint's tool format (its chat template's, or ``configured``), whether the
    template renders tools, and the format's marker as its special token where it is one."""
    fmt, renders = of_template(getattr(tokenizer, "chat_template", None), configured)
    added = {t.content: (i, t.special) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    token, special = added.get(fmt.marker, (None, False))
    return fmt, renders, ({fmt.marker: token} if fmt.marker and special else {})


def lark_literal(text: str, specials: Mapping[str, int]) -> str:
    """``text`` as a Lark expression: quoted text, with each special token's text as that
    token (``<[id]>``) so that the model writes the token, not its spelling."""
    if not text:
        return '""'
    found = [s for s in specials if s in text]
    if not found:
        return json.dumps(text)
    pattern = "(" + "|".join(map(re.escape, sorted(found, key=len, reverse=True))) + ")"
    pieces = [p for p in re.split(pattern, text) if p]
    return " ".join(f"<[{specials[p]}]>" if p in specials else json.dumps(p) for p in pieces)
