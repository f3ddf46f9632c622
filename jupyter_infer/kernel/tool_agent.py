"""A tool-using agent in a few lines: Python functions as tools, and the loop agents run —
the model calls tools, they run, their results go back, the model answers.

    run = await run_tool_agent(client, "What is the weather in Paris?", [get_weather])
    run                      # in a notebook: each call, its arguments, its result, the answer

The calls are grammar-constrained on this server (a declared tool, arguments that fit its
signature), so they parse whatever the model; from an upstream that does not constrain its
calls, a call that names no such tool or whose arguments are not JSON gets that as its result. The first turn's ``tool_choice`` is
``first`` ("required" by default: the agent starts by using a tool), later turns "auto",
and the last turn "none" so that a run always ends in an answer.
"""

from __future__ import annotations

import asyncio
import html
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .client import Client, Completion
from .client.function_tools import function_tool


@dataclass
class ToolStep:
    """One tool call the model made and what the tool answered."""

    name: str
    arguments: dict[str, Any]
    result: str
    error: bool = False


@dataclass
class ToolRun:
    """A run of ``run_tool_agent``: the chat as it grew, the calls, the answer."""

    question: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[ToolStep] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    answer: str = ""

    def to_html(self) -> str:
        rows = "".join(
            f"<tr><td><code>{html.escape(s.name)}</code></td><td><code>{html.escape(json.dumps(s.arguments))}"
            f"</code></td><td>{'⚠ ' if s.error else ''}{html.escape(s.result[:200])}</td></tr>" for s in self.steps)
        calls = (f"<table><tr><th>tool</th><th>arguments</th><th>result</th></tr>{rows}</table>" if rows
                 else "<p>No tool calls.</p>")
        return (f"<div><p><b>Question:</b> {html.escape(self.question)}</p>{calls}"
                f"<p><b>Answer</b> ({len(self.completions)} model calls): {html.escape(self.answer)}</p></div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        calls = "; ".join(f"{s.name}({json.dumps(s.arguments)}) -> {s.result[:60]}" for s in self.steps)
        return f"{self.question}\n  calls: {calls or 'none'}\n  answer: {self.answer}"


def _arguments(call: dict[str, Any]) -> dict[str, Any] | None:
    """A call's arguments (``None``: not a JSON object, e.g. from an upstream that does not
    constrain its calls)."""
    try:
        value = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def _run(tool: Callable[..., Any] | None, arguments: dict[str, Any] | None) -> tuple[str, bool]:
    """A tool's result as text (an error is a result too: the model sees what went wrong)."""
    if tool is None:
        return "No such tool.", True
    if arguments is None:
        return "The arguments are not a JSON object.", True
    try:
        value = tool(**arguments)
        if inspect.isawaitable(value):
            value = await value
        return (value if isinstance(value, str) else json.dumps(value, default=str)), False
    except Exception as err:  # the tool's failure goes back to the model, as agents do
        return f"{type(err).__name__}: {err}", True


async def run_tool_agent(
    client: Client, question: str, tools: Sequence[Callable[..., Any]], *, system: str | None = None,
    first: str = "required", max_turns: int = 4, max_tokens: int = 128, temperature: float = 0.0,
) -> ToolRun:
    """Ask ``question`` with ``tools`` (plain or async Python functions) until the model
    answers in text, at most ``max_turns`` model calls."""
    by_name = {t.__name__: t for t in tools}
    specs = [function_tool(t) for t in tools]
    run = ToolRun(question, [*([{"role": "system", "content": system}] if system else []),
                             {"role": "user", "content": question}])
    for turn in range(max_turns):
        choice = "none" if turn == max_turns - 1 else (first if turn == 0 else "auto")
        completion = await client.achat(run.messages, tools=specs, tool_choice=choice, max_tokens=max_tokens,
                                        temperature=temperature)
        run.completions.append(completion)
        if not completion.tool_calls:
            run.answer = completion.text
            break
        run.messages.append({"role": "assistant", "content": completion.text or None,
                             "tool_calls": completion.tool_calls})
        calls = completion.tool_calls
        arguments = [_arguments(c) for c in calls]
        results = await asyncio.gather(*(_run(by_name.get(c["function"]["name"]), a)
                                         for c, a in zip(calls, arguments, strict=True)))
        for call, args, (result, failed) in zip(calls, arguments, results, strict=True):
            run.steps.append(ToolStep(call["function"]["name"], args or {}, result, failed))
            run.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return run
