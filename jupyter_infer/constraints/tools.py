"""Tool calls on any model: the tools in the prompt, a grammar for the calls, and the calls
read back out of the text (whole, or streamed as OpenAI streams them).

The calls are written in the model family's format (``tool_formats``: Hermes' ``<tool_call>``
by default, Llama 3's JSON, Mistral's, Granite's). ``tool_choice`` decides the grammar:
``required`` and a named function are constrained from the first token (the name is one of
the declared ones and the arguments fit that tool's schema); ``auto`` allows either text
(which then may not start as calls do) or calls; ``none`` constrains nothing.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import InvalidRequest
from ..values.request import show
from .spec import MAX_SPEC_CHARS, Constraint, ToolsConstraint, closed_schema, seconds_below_60
from .tool_formats import (
    FORMATS,
    HERMES,
    CallDelta,
    PythonCallParser,
    ToolFormat,
    lark_literal,
    new_call_id,
    python_literal,
)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]*")
# A call's arguments as Jinja's ``tojson`` lays them out (the templates' own rendering of a call).
_ARGUMENT_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_TOOLS = 512


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolSet:
    """The tools a chat offers and how it may call them (``choice``: ``auto``,
    ``required``, or a tool's name). One value from the body (``from_body``) to the grammar
    and the answer, carried by its constraint (``constraint()``); a change is a new value
    (``written_as`` the model's format, ``answering_with`` a schema)."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True
    legacy: bool = False  # asked as ``functions``: answered as ``message.function_call``
    # The JSON schema a text answer must fit (``response_format`` sent beside the tools: an
    # agent with tools and a structured final output); None: free text.
    text_schema: dict[str, Any] | None = None
    format: str = "hermes"  # how the model writes calls (tool_formats), set for the model that runs it
    # The format's marker as the model's special token ({text: id}), where it is one.
    specials: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ToolSet | None:
        """``tools`` / ``tool_choice`` / ``parallel_tool_calls`` (or the legacy ``functions``
        / ``function_call``); ``None`` when there are none or the choice is ``none``."""
        legacy = body.get("tools") is None and body.get("functions") is not None
        raw = body.get("functions") if legacy else body.get("tools")
        choice = body.get("function_call") if legacy else body.get("tool_choice")
        if raw is None or raw == []:
            if choice not in (None, "none", "auto"):
                what = "is 'required'" if choice == "required" else "names a tool"
                name, listed = ("tool_choice", "tools") if body.get("tool_choice") is not None else (
                    "function_call", "functions")
                raise InvalidRequest(f"'{name}' {what}, but the request has no '{listed}'.", param=name)
            return None
        tools = _tools(raw, legacy)
        choice = _choice(choice, {t.name for t in tools}, legacy)
        if choice == "none":
            return None
        parallel = body.get("parallel_tool_calls")
        parallel = True if parallel is None else parallel
        if not isinstance(parallel, bool):
            raise InvalidRequest("'parallel_tool_calls' must be true or false.", param="parallel_tool_calls")
        return cls(tools, choice, parallel and not legacy, legacy)

    def constraint(self) -> ToolsConstraint:
        """The constraint that carries this set. Its ``spec`` is the set as JSON, every field
        (equal specs, equal sets: the grammar's cache key), written here and never read back."""
        spec = {f.name: getattr(self, f.name) for f in fields(self)} | {"tools": [vars(t) for t in self.tools]}
        return ToolsConstraint("tools", json.dumps(spec), param="tools", tools=self)

    def written_as(self, fmt: ToolFormat, specials: Mapping[str, int]) -> ToolSet:
        """This set, its calls in ``fmt`` (``specials``: the model's special tokens by text)."""
        marker = {fmt.marker: specials[fmt.marker]} if fmt.marker in specials else {}
        if (fmt.name, marker) == (self.format, self.specials):
            return self  # written so already (Hermes, the default): the same value
        if fmt.python:  # a call is Python: its tools' names and arguments must be Python names
            for tool in self.tools:
                names = [tool.name, *(tool.parameters.get("properties") or {})]
                bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
                if bad:
                    raise InvalidRequest(f"This model writes tool calls as Python (pythonic), and {show(bad[0])} in "
                                         f"the tool {show(tool.name)} is not a Python name: rename it.", param="tools")
        return replace(self, format=fmt.name, specials=marker)

    @property
    def tool_format(self) -> ToolFormat:
        return FORMATS[self.format]

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI's ``tools`` list (what a chat template's ``tools`` reads)."""
        return [{"type": "function", "function": dict(vars(t))} for t in self.tools]

    def answering_with(self, constraint: Constraint) -> ToolSet:
        """This set, its text answers fitting ``constraint`` (a JSON object or schema): the
        answer is then calls or an object that fits. Other text constraints do not combine."""
        if constraint.kind not in ("json_object", "json_schema"):
            raise InvalidRequest(f"A request with tools can constrain its text answer to a JSON schema or object "
                                 f"(response_format), not a {constraint.kind}: send one or the other.",
                                 param=constraint.param or "response_format")
        schema = {"type": "object"} if constraint.kind == "json_object" else seconds_below_60(json.loads(constraint.spec))
        return replace(self, text_schema=schema)

    @property
    def named(self) -> bool:
        return self.choice not in ("auto", "required")

    def lark(self) -> str:
        """The grammar of this set's answers (llguidance's Lark, with ``%json`` schemas)."""
        fmt = self.tool_format
        tools = [t for t in self.tools if not self.named or t.name == self.choice]
        # The call object is literal text around each tool's arguments, which are their own
        # schema's root (so its "#" and "#/$defs/..." references resolve where they were written).
        rules = [rule for i, t in enumerate(tools) for rule in (_python_rules(i, t) if fmt.python else (
            f't{i}: {json.dumps(fmt.head(t.name))} a{i} "}}"', f"a{i}: %json{json.dumps(_arguments_schema(t))}"))]
        call = " ".join(_lits(fmt.open) + [f'({" | ".join(f"t{i}" for i in range(len(tools)))})'] + _lits(fmt.close))
        several = self.parallel and fmt.parallel and not self.named
        more = f" ({' '.join(_lits(fmt.sep) + ['call'])})*" if several else ""
        calls = " ".join(_lits(fmt.marker, self.specials) + _lits(fmt.begin) + [f"call{more}"] + _lits(fmt.end))
        not_calls = re.sub(r"([\\\]\[^-])", r"\\\1", fmt.text_may_not_start())
        start = f"start: calls | TEXT\nTEXT: /[^{not_calls}](.|\\n)*/" if self.choice == "auto" else "start: calls"
        if self.choice == "auto" and self.text_schema is not None:  # calls, or an object that fits
            schema = self.text_schema
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_flexible": False}}  # compact, as json_schema's
            start = f"start: calls | answer\nanswer: %json{json.dumps(schema)}"
        return "\n".join([start, f"calls: {calls}", f"call: {call}", *rules])

    def system_prompt(self) -> str:
        """The built-in tool prompt, for a model whose chat template does not render tools."""
        fmt = self.tool_format
        listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                           for t in self.tools)
        example = fmt.calls([("<tool name>", "<arguments object>")]).replace('"<tool name>"', "<tool name>")
        if fmt.python:
            example = fmt.calls([("tool_name", "argument=value, ...")])
        several = f", calls separated by {json.dumps(fmt.sep)}" if fmt.parallel and fmt.sep.strip() else ""
        return ("You can call these tools (each with a JSON Schema of its arguments):\n" + listed +
                f"\nTo call a tool, answer with {example}{several}, and nothing else." + (
                    "\nOtherwise answer with a JSON object that fits this schema, and nothing else:\n"
                    + json.dumps(self.text_schema) if self.text_schema is not None else ""))


def _lits(text: str, specials: Mapping[str, int] | None = None) -> list[str]:
    """``text`` as Lark pieces (none for no text)."""
    return [lark_literal(text, specials or {})] if text else []


def _python_rules(i: int, tool: Tool) -> list[str]:
    """A tool's call as Python, ``name(key=value, ...)``: its required arguments in the schema's
    order, then any of its optional ones, in order; each value a Python literal of its schema
    (JSON's text where JSON and Python agree: strings, numbers; ``True``/``False``/``None``)."""
    schema = _arguments_schema(tool)
    props = schema.get("properties") or {}
    needed = set(schema.get("required") or ())
    required = [k for k in props if k in needed]
    optional = [k for k in props if k not in needed]
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    rules = [f"v{i}_{j}: {_python_value(props[k], defs)}" for j, k in enumerate(props)]
    item = {k: f'"{k}=" v{i}_{j}' for j, k in enumerate(props)}
    tail = "".join(f' (", " {item[k]})?' for k in optional)  # each optional one, after a comma
    if required:
        body = ' ", " '.join(item[k] for k in required) + tail
    else:  # the first one present takes no comma
        body = "(" + " | ".join(item[k] + "".join(f' (", " {item[o]})?' for o in optional[n + 1:])
                                for n, k in enumerate(optional)) + ")?" if optional else '""'
    return [f"t{i}: {json.dumps(tool.name + '(')} {body} \")\"", *rules]


def _python_value(schema: Any, defs: dict[str, Any]) -> str:
    if isinstance(schema, dict) and ("enum" in schema or "const" in schema):
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        return " | ".join(json.dumps(python_literal(v)) for v in values)
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean":
        return '"True" | "False"'
    if kind == "null":
        return '"None"'
    value = {**schema, **defs, "x-guidance": _ARGUMENT_LAYOUT} if isinstance(schema, dict) else schema
    return f"%json{json.dumps(value)}"  # JSON's text (an object's true/false/null read back all the same)


def _arguments_schema(tool: Tool) -> dict[str, Any]:
    """A tool's arguments: its parameters' schema, closed to the keys it declares
    (``closed_schema``: a call names its arguments, it does not invent more), compact."""
    return {**seconds_below_60(closed_schema(dict(tool.parameters))), "x-guidance": _ARGUMENT_LAYOUT}


def _tools(raw: Any, legacy: bool) -> tuple[Tool, ...]:
    param = "functions" if legacy else "tools"
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise InvalidRequest(f"'{param}' must be a list of at most {MAX_TOOLS} tools.", param=param)
    if len(json.dumps(raw)) > MAX_SPEC_CHARS:
        raise InvalidRequest(f"'{param}' is over {MAX_SPEC_CHARS:,} characters of JSON.", param=param)
    tools, names = [], set()
    for i, item in enumerate(raw):
        fn = item if legacy else (item.get("function") if isinstance(item, dict) else None)
        if not legacy and (not isinstance(item, dict) or item.get("type", "function") != "function"):
            raise InvalidRequest(f"{param}[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}; "
                                 "only function tools are supported.", param=param)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise InvalidRequest(f"{param}[{i}] needs a function 'name' of 1 to 64 letters, digits, '_', '.' "
                                 "or '-'.", param=param)
        if fn["name"] in names:
            raise InvalidRequest(f"Two tools are named {fn['name']!r}.", param=param)
        parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"{param}[{i}].parameters must be a JSON schema object; got {show(parameters)}.",
                                 param=param)
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise InvalidRequest(f"{param}[{i}].description must be a string.", param=param)
        names.add(fn["name"])
        tools.append(Tool(fn["name"], description, parameters))
    return tuple(tools)


def _choice(choice: Any, names: set[str], legacy: bool) -> str:
    param = "function_call" if legacy else "tool_choice"
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return choice
    name = None
    if isinstance(choice, dict):
        fn = choice if legacy else choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(f"'{param}' must be 'none', 'auto', 'required' or {{\"type\": \"function\", "
                             f"\"function\": {{\"name\": ...}}}}; got {show(choice)}.", param=param)
    if name not in names:
        raise InvalidRequest(f"'{param}' names the tool {show(name)}, which is not among the request's tools "
                             f"({', '.join(sorted(names))}).", param=param)
    return name


# -- the calls back out ------------------------------------------------------------------------
def call_text(name: str, arguments: str, fmt: ToolFormat = HERMES) -> str:
    """One call as the model writes it (an assistant message's ``tool_calls`` rendered back)."""
    return fmt.calls([(name, arguments)])


def _eat(buffer: str, literal: str) -> int | None:
    """Where ``literal`` ends at the start of ``buffer``, whitespace aside on both sides:
    -1 while ``buffer`` is a beginning of it, ``None`` when it is not there."""
    i = 0
    for ch in literal:
        if ch.isspace():
            continue
        while i < len(buffer) and buffer[i].isspace():
            i += 1
        if i == len(buffer):
            return -1
        if buffer[i] != ch:
            return None
        i += 1
    return i


@dataclass
class CallParser:
    """Reads the text of a tool-set answer as it streams: ``feed`` each piece, ``finish``
    at the end; ``calls`` are the complete calls (OpenAI's ``tool_calls`` entries). The text
    is read in ``format``, its layout's whitespace aside, its marker there or not (a special
    token's text is left out of decoded text)."""

    format: ToolFormat = HERMES
    buffer: str = ""
    mode: str | None = None  # None (undecided), "text", "calls"
    calls: list[dict[str, Any]] = field(default_factory=list)
    complete: int = 0  # calls whose closing text came
    content: str = ""
    _in_call: bool = False
    _done: bool = False  # the current call's arguments are whole (its closing text is next)
    _ended: bool = False  # the calls' end came (or text that is not a call: the rest is ignored)
    _depth: int = 0  # where the arguments' JSON is: nesting, inside a string, after a backslash
    _in_str: bool = False
    _esc: bool = False

    def feed(self, text: str) -> list[CallDelta]:
        self.buffer += text
        if self.mode is None:
            mode = self._mode()
            if mode is None:
                return []
            self.mode = mode
            if mode == "calls":
                self.buffer = self.buffer.lstrip()
                marker = self.format.marker
                if marker and self.buffer.startswith(marker):
                    self.buffer = self.buffer[len(marker):]
        if self.mode == "text":
            out, self.buffer = self.buffer, ""
            self.content += out
            return [CallDelta(content=out)] if out else []
        return self._calls()

    def _mode(self) -> str | None:
        """Calls or text, once the start tells (``None``: not yet)."""
        got = self.buffer.lstrip()
        if not got:
            return None
        marker = self.format.marker
        if marker:
            if marker.startswith(got) and len(got) < len(marker):
                return None
            if got.startswith(marker):
                got = got[len(marker):]
        at = _eat(got, self.format.first())
        return None if at == -1 else ("text" if at is None else "calls")

    def _calls(self) -> list[CallDelta]:
        out: list[CallDelta] = []
        while not self._ended:
            if not self._in_call and not self._head(out):
                return out
            if not self._done:
                if not self.calls[-1]["function"]["arguments"]:
                    self.buffer = self.buffer.lstrip()  # the layout's space before the arguments
                end = self._arguments_end()
                out += self._piece(self.buffer if end < 0 else self.buffer[:end])
                self.buffer = "" if end < 0 else self.buffer[end:]
                if end < 0:
                    return out
                self._done = True
            at = _eat(self.buffer, "}" + self.format.close)  # the call object's own "}", its closing text
            if at == -1:
                return out
            self._in_call = False
            self.complete += 1
            if at is None:  # not the format's: the calls end here
                self._ended = True
                return out
            self.buffer = self.buffer[at:]
        return out

    def _head(self, out: list[CallDelta]) -> bool:
        """The next call's start, up to its arguments (``False``: not yet, or the calls ended)."""
        fmt = self.format
        lead = fmt.first() if not self.calls else fmt.sep + fmt.open + '{"name": "'
        at = _eat(self.buffer, lead)
        if at is None or at == -1:
            ended = _eat(self.buffer, fmt.end) if fmt.end else None
            self._ended = at is None and ended != -1
            return False
        name = _NAME_CHARS.match(self.buffer, at)
        if name.end() == len(self.buffer):
            return False  # the name is still coming
        rest = _eat(self.buffer[name.end():], f'", "{fmt.arguments}": ')
        if rest == -1:
            return False
        if rest is None or not _NAME.match(name.group()):
            self._ended = True
            return False
        call = {"id": new_call_id(), "type": "function", "function": {"name": name.group(), "arguments": ""}}
        self.calls.append(call)
        out.append(CallDelta(index=len(self.calls) - 1, id=call["id"], name=name.group(), arguments=""))
        self.buffer, self._in_call, self._done = self.buffer[name.end() + rest:], True, False
        self._depth, self._in_str, self._esc = 0, False, False
        return True

    def _arguments_end(self) -> int:
        """Where in ``buffer`` the arguments' JSON ends (the call object's own ``}``), or -1:
        read as JSON, so a closing text inside a string does not end them."""
        for i, ch in enumerate(self.buffer):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                if self._depth == 0:
                    return i
                self._depth -= 1
        return -1

    def _piece(self, piece: str) -> list[CallDelta]:
        if not piece:
            return []
        self.calls[-1]["function"]["arguments"] += piece
        return [CallDelta(index=len(self.calls) - 1, arguments=piece)]

    def finish(self) -> list[CallDelta]:
        """The rest: a call cut short by ``max_tokens`` streams what it had (its arguments
        are not whole JSON; ``complete`` does not count it)."""
        if self.mode is None and self.buffer:
            self.mode = "text"
            return self.feed("")
        if self.mode == "calls" and self._in_call:
            if self._done:  # whole arguments, only the closing text missing: a whole call
                self.buffer, self._in_call = "", False
                self.complete += 1
                return []
            rest, self.buffer = self.buffer, ""
            return self._piece(rest)
        return []


def parser_for(fmt: ToolFormat) -> CallParser | PythonCallParser:
    """The reader of answers in ``fmt`` (``feed`` pieces, ``finish``, ``calls``)."""
    return PythonCallParser(fmt) if fmt.python else CallParser(fmt)


def parse_calls(text: str, fmt: ToolFormat = HERMES, *, cut: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer: its text content (``None`` when it is calls) and its complete calls;
    ``cut``: a call cut short by ``max_tokens`` too, with the arguments it had (as OpenAI
    answers one; they are not whole JSON)."""
    parser = parser_for(fmt)
    parser.feed(text)
    parser.finish()
    if parser.mode == "calls":
        return None, parser.calls if cut else parser.calls[: parser.complete]
    return parser.content, []

