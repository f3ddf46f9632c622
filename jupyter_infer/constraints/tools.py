"""Tool calls on any model: the tools in the prompt, a grammar for the calls, and the calls
read back out of the text (whole, or streamed as OpenAI streams them).

The format is Hermes' (Qwen's, many others'): one ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` per call, in compact JSON, the name first. ``tool_choice`` decides the
grammar: ``required`` and a named function are constrained from the first token (the name
is one of the declared ones and the arguments fit that tool's schema); ``auto`` allows
either text (which then may not open with ``<``) or calls; ``none`` constrains nothing.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from ..values.request import show
from .spec import MAX_SPEC_CHARS, Constraint, closed_schema, seconds_below_60

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'<tool_call>\{"name":"([A-Za-z0-9_.-]{1,64})","arguments":')
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 512


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class ToolSet:
    """The tools a chat offers and how it may call them (``choice``: ``auto``,
    ``required``, or a tool's name)."""

    tools: list[Tool]
    choice: str = "auto"
    parallel: bool = True
    legacy: bool = False  # asked as ``functions``: answered as ``message.function_call``
    # The JSON schema a text answer must fit (``response_format`` sent beside the tools: an
    # agent with tools and a structured final output); None: free text.
    text_schema: dict[str, Any] | None = None

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

    @classmethod
    def from_constraint(cls, constraint: Constraint) -> ToolSet:
        value = constraint.value
        return cls([Tool(**t) for t in value["tools"]], value["choice"], value["parallel"],
                   text_schema=value.get("text_schema"))

    def constraint(self) -> Constraint:
        spec = {"tools": [t.__dict__ for t in self.tools], "choice": self.choice, "parallel": self.parallel,
                "text_schema": self.text_schema}
        return Constraint("tools", json.dumps(spec), param="tools")

    def answering_with(self, constraint: Constraint) -> ToolSet:
        """This set, its text answers fitting ``constraint`` (a JSON object or schema): the
        answer is then calls or an object that fits. Other text constraints do not combine."""
        if constraint.kind not in ("json_object", "json_schema"):
            raise InvalidRequest(f"A request with tools can constrain its text answer to a JSON schema or object "
                                 f"(response_format), not a {constraint.kind}: send one or the other.",
                                 param=constraint.param or "response_format")
        schema = {"type": "object"} if constraint.kind == "json_object" else seconds_below_60(json.loads(constraint.spec))
        return ToolSet(self.tools, self.choice, self.parallel, self.legacy, schema)

    @property
    def named(self) -> bool:
        return self.choice not in ("auto", "required")

    def lark(self) -> str:
        """The grammar of this set's answers (llguidance's Lark, with ``%json`` schemas)."""
        tools = [t for t in self.tools if not self.named or t.name == self.choice]
        # The call object is literal text around each tool's arguments, which are their own
        # schema's root (so its "#" and "#/$defs/..." references resolve where they were written).
        rules = [rule for i, t in enumerate(tools) for rule in (
            f't{i}: {json.dumps(call_head(t.name))} a{i} "}}"', f"a{i}: %json{json.dumps(_arguments_schema(t))}")]
        call = f'call: "{OPEN}" ({" | ".join(f"t{i}" for i in range(len(tools)))}) "{CLOSE}"'
        calls = 'calls: call ("\\n" call)*' if self.parallel and not self.named else "calls: call"
        start = "start: calls | TEXT\nTEXT: /[^<](.|\\n)*/" if self.choice == "auto" else "start: calls"
        if self.choice == "auto" and self.text_schema is not None:  # calls, or an object that fits
            schema = self.text_schema
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_flexible": False}}  # compact, as json_schema's
            start = f"start: calls | answer\nanswer: %json{json.dumps(schema)}"
        return "\n".join([start, calls, call, *rules])

    def system_prompt(self) -> str:
        listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                           for t in self.tools)
        return ("You can call these tools (each with a JSON Schema of its arguments):\n" + listed +
                f"\nTo call a tool, answer with {OPEN}{{\"name\": <tool name>, \"arguments\": <arguments object>}}"
                f"{CLOSE}, one per call, and nothing else." + (
                    "\nOtherwise answer with a JSON object that fits this schema, and nothing else:\n"
                    + json.dumps(self.text_schema) if self.text_schema is not None else ""))


def call_head(name: str) -> str:
    """A call's JSON up to its arguments: the name first (a stream names the call at once)."""
    return '{"name":' + json.dumps(name) + ',"arguments":'


def _arguments_schema(tool: Tool) -> dict[str, Any]:
    """A tool's arguments: its parameters' schema, closed to the keys it declares
    (``closed_schema``: a call names its arguments, it does not invent more), compact."""
    return {**seconds_below_60(closed_schema(dict(tool.parameters))), "x-guidance": {"whitespace_flexible": False}}


def _tools(raw: Any, legacy: bool) -> list[Tool]:
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
    return tools


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
def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it (an assistant message's ``tool_calls`` rendered back)."""
    return f"{OPEN}{call_head(name)}{arguments or '{}'}}}{CLOSE}"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallDelta:
    """A piece of the answer: ``content`` text, or a call's start (``id`` and ``name``) or
    a piece of its ``arguments``, by the call's ``index``."""

    content: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class CallParser:
    """Reads the text of a tool-set answer as it streams: ``feed`` each piece, ``finish``
    at the end; ``calls`` are the complete calls (OpenAI's ``tool_calls`` entries)."""

    buffer: str = ""
    mode: str | None = None  # None (undecided), "text", "calls"
    calls: list[dict[str, Any]] = field(default_factory=list)
    complete: int = 0  # calls whose closing tag came
    _in_call: bool = False
    _done: bool = False  # the current call's arguments are whole (its closing tag is next)
    _depth: int = 0  # where the arguments' JSON is: nesting, inside a string, after a backslash
    _in_str: bool = False
    _esc: bool = False
    content: str = ""

    def feed(self, text: str) -> list[CallDelta]:
        self.buffer += text
        if self.mode is None:
            if not self.buffer:
                return []
            if OPEN.startswith(self.buffer[: len(OPEN)]) and len(self.buffer) < len(OPEN):
                return []  # could still open a call
            self.mode = "calls" if self.buffer.startswith(OPEN) else "text"
        if self.mode == "text":
            out, self.buffer = self.buffer, ""
            self.content += out
            return [CallDelta(content=out)] if out else []
        return self._calls()

    def _calls(self) -> list[CallDelta]:
        out: list[CallDelta] = []
        while True:
            if not self._in_call:
                self.buffer = self.buffer.lstrip("\n")
                head = _HEAD.match(self.buffer)
                if head is None:
                    return out
                call = {"id": new_call_id(), "type": "function", "function": {"name": head.group(1), "arguments": ""}}
                self.calls.append(call)
                out.append(CallDelta(index=len(self.calls) - 1, id=call["id"], name=head.group(1), arguments=""))
                self.buffer, self._in_call, self._done = self.buffer[head.end():], True, False
                self._depth, self._in_str, self._esc = 0, False, False
            if not self._done:
                end = self._arguments_end()
                out += self._piece(self.buffer if end < 0 else self.buffer[:end])
                self.buffer = "" if end < 0 else self.buffer[end:]
                if end < 0:
                    return out
                self._done = True
            if len(self.buffer) < 1 + len(CLOSE):  # the call's "}</tool_call>" is still coming
                return out
            self.buffer, self._in_call = self.buffer[1 + len(CLOSE):], False
            self.complete += 1

    def _arguments_end(self) -> int:
        """Where in ``buffer`` the arguments' JSON ends (the call object's own ``}``), or -1:
        read as JSON, so a ``}</tool_call>`` inside a string does not end them."""
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
            if self._done:  # whole arguments, only the closing tag missing: a whole call
                self.buffer, self._in_call = "", False
                self.complete += 1
                return []
            rest, self.buffer = self.buffer, ""
            return self._piece(rest)
        return []


def parse_calls(text: str, *, cut: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer: its text content (``None`` when it is calls) and its complete calls;
    ``cut``: a call cut short by ``max_tokens`` too, with the arguments it had (as OpenAI
    answers one; they are not whole JSON)."""
    parser = CallParser()
    parser.feed(text)
    parser.finish()
    if parser.mode == "calls":
        return None, parser.calls if cut else parser.calls[: parser.complete]
    return parser.content, []
