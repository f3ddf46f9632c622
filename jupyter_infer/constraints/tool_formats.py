"""How each model family writes tool calls: the text around the calls and around each call,
the key its arguments go under, and how a chat template shows the family.

A call is a JSON object, the name first, laid out as the family's templates render one
(Jinja's ``tojson``: ``", "`` and ``": "``), so a trained model writes it as it learnt to:

- ``hermes`` (Qwen 2.5/3, Hermes, many others): ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``
- ``llama3_json`` (Llama 3.1–3.3): ``{"name": …, "parameters": …}``, one call per answer
- ``mistral``: ``[TOOL_CALLS][{"name": …, "arguments": …}, …]``
- ``granite`` (Granite 3.x): ``<|tool_call|>[{"name": …, "arguments": …}, …]``

and one family writes them as Python: ``pythonic`` (Llama 3.2's and 4's pythonic templates):
``[get_weather(city="Paris", metric=True), …]``, read back with Python's own parser.

A family's ``marker`` (Mistral's ``[TOOL_CALLS]``) is often a special token of its tokenizer:
the grammar then writes that token, not its spelling, and the decoded text leaves it out, so
the calls are read back with or without it.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    python: bool = False  # each call as Python: name(key=value, ...)

    def call(self, name: str, arguments: str) -> str:
        """One call object, as the family writes it (``arguments``: JSON text)."""
        if self.python:
            return python_call(name, arguments)
        return '{"name": ' + json.dumps(name) + f', "{self.arguments}": ' + (arguments or "{}") + "}"

    def calls(self, calls: list[tuple[str, str]]) -> str:
        """An answer of ``(name, arguments)`` calls, as the model writes it."""
        body = self.sep.join(self.open + self.call(name, args) + self.close for name, args in calls)
        return self.marker + self.begin + body + self.end

    def head(self, name: str) -> str:
        """A call up to its arguments (a stream names the call at once)."""
        return f"{name}(" if self.python else '{"name": ' + json.dumps(name) + f', "{self.arguments}": '

    def first(self) -> str:
        """What every answer of calls starts with after its marker, up to the first name."""
        return self.begin + self.open + ("" if self.python else '{"name": "')

    def text_may_not_start(self) -> str:
        """The characters a text answer may not start with (they would start calls)."""
        return "".join(dict.fromkeys(s[0] for s in (self.marker, self.first()) if s))


HERMES = ToolFormat("hermes", open="<tool_call>\n", close="\n</tool_call>", sep="\n")
FORMATS = {f.name: f for f in (
    HERMES,
    ToolFormat("llama3_json", arguments="parameters", parallel=False, sep="; "),
    ToolFormat("mistral", marker="[TOOL_CALLS]", begin="[", sep=", ", end="]", id_length=9),
    ToolFormat("granite", marker="<|tool_call|>", begin="[", sep=", ", end="]"),
    ToolFormat("pythonic", begin="[", sep=", ", end="]", python=True),
)}

# What in a chat template shows the family (its own rendering of a call), in this order.
_SIGNS = [("mistral", "[TOOL_CALLS]"), ("granite", "<|tool_call|>"), ("hermes", "<tool_call>"),
          ("pythonic", "[func_name1("), ("llama3_json", '"parameters": ')]
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


# -- calls as Python (pythonic) -----------------------------------------------------------------
def python_literal(value: Any) -> str:
    """A JSON value as a Python literal (strings as JSON writes them: valid Python too)."""
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(python_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def python_call(name: str, arguments: str) -> str:
    """``name(key=value, ...)`` of JSON ``arguments`` (text that is not JSON goes in as it is)."""
    try:
        values = json.loads(arguments or "{}")
    except ValueError:
        return f"{name}({arguments})"
    return f"{name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in values.items()) + ")"


_JSON_NAMES = {"true": True, "false": False, "null": None}  # a model that writes JSON's literals


def _python_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_python_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {str(_python_value(k)): _python_value(v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def read_python_call(text: str) -> tuple[str, str] | None:
    """``(name, JSON arguments)`` of one call written as Python; None if it is not one."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        values = {kw.arg: _python_value(kw.value) for kw in node.keywords if kw.arg is not None}
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None
    return node.func.id, json.dumps(values, ensure_ascii=False)


@dataclass
class CallDelta:
    """A piece of the answer: ``content`` text, or a call's start (``id`` and ``name``) or
    a piece of its ``arguments``, by the call's ``index``."""

    content: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass
class PythonCallParser:
    """``CallParser`` for calls written as Python: ``[name(key=value, ...), ...]``, each call
    streamed whole once its closing parenthesis comes (its arguments as JSON)."""

    format: ToolFormat = field(default_factory=lambda: FORMATS["pythonic"])
    buffer: str = ""
    mode: str | None = None  # None (undecided), "text", "calls"
    calls: list[dict[str, Any]] = field(default_factory=list)
    complete: int = 0
    content: str = ""
    _ended: bool = False

    def feed(self, text: str) -> list[CallDelta]:
        self.buffer += text
        if self.mode is None:
            got = self.buffer.lstrip()
            after = got[1:].lstrip()
            name = _PY_NAME.match(after)
            if not got or got[0] == "[" and (not after or name and name.end() == len(after)):
                return []  # not yet told: "[" alone, or a name still coming
            # Calls start "[name(": "[1]" or "[Note] ..." are text.
            self.mode = "calls" if got[0] == "[" and name and after[name.end()] == "(" else "text"
            if self.mode == "calls":
                self.buffer = got[1:]
        if self.mode == "text":
            out, self.buffer = self.buffer, ""
            self.content += out
            return [CallDelta(content=out)] if out else []
        return self._calls()

    def _calls(self) -> list[CallDelta]:
        out: list[CallDelta] = []
        while not self._ended:
            rest = self.buffer.lstrip()
            if self.calls and rest[:1] == ",":
                rest = rest[1:].lstrip()
            end = _call_end(rest)
            if end is None:
                self._ended = bool(rest) and not _PY_NAME.match(rest) or rest.startswith("]")
                return out
            read = read_python_call(rest[:end])
            if read is None:
                self._ended = True
                return out
            call = {"id": new_call_id(), "type": "function", "function": {"name": read[0], "arguments": read[1]}}
            self.calls.append(call)
            self.complete += 1
            out.append(CallDelta(index=len(self.calls) - 1, id=call["id"], name=read[0], arguments=read[1]))
            self.buffer = rest[end:]
        return out

    def finish(self) -> list[CallDelta]:
        """The rest: a call cut short by ``max_tokens`` streams its name and the text it had
        (not JSON; ``complete`` does not count it)."""
        if self.mode is None and self.buffer:
            self.mode = "text"
            return self.feed("")
        rest = self.buffer.lstrip().lstrip(",").lstrip()
        name = _PY_NAME.match(rest)
        if self.mode == "calls" and not self._ended and name and rest[name.end():].startswith("("):
            self.buffer = ""
            call = {"id": new_call_id(), "type": "function",
                    "function": {"name": name.group(), "arguments": rest[name.end() + 1:]}}
            self.calls.append(call)
            return [CallDelta(index=len(self.calls) - 1, id=call["id"], name=name.group(), arguments=rest[name.end() + 1:])]
        return []


def _call_end(text: str) -> int | None:
    """Where the call at the start of ``text`` ends (after its ``)``), read as Python (a
    parenthesis in a string does not count); None while it has not ended."""
    name = _PY_NAME.match(text)
    if not name or not text[name.end():].startswith("("):
        return None
    depth, quote, escaped = 0, "", False
    for i in range(name.end(), len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
