"""A tools request's answer, read once at its end for both loops: the calls it makes.

The engine finished the row as "stop" (or "length"); whether its text is calls is for the tool
format of the model that wrote it to say. Read here, the calls ride on the result
(``RequestResult.tool_calls``) and the record says "tool_calls" (``infer/batches``), so that
no handler reads the answer again or writes back into the core's record.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..constraints.tool_formats import FORMATS
from ..constraints.tools import ToolSet, parser_for
from ..wire.reasoning import split_reasoning

if TYPE_CHECKING:
    from ..values.request import RequestResult
    from ..values.sequence import Sequence


def with_calls(seq: Sequence, result: RequestResult, tool_format: str, reasons: bool) -> RequestResult:
    """``result`` with the calls its answer makes, where ``seq`` offered tools (its model
    writes them in ``tool_format``; ``reasons``: its answers may open with a reasoning
    section, which holds no calls). A call to a tool the request named keeps "stop", as
    OpenAI's answers do."""
    constraint = seq.request.params.constraint
    if constraint is None or constraint.kind != "tools" or result.finish_reason not in ("stop", "length"):
        return result
    text = split_reasoning(result.text, seq.request.opened_reasoning)[1] if reasons else result.text
    parser = parser_for(FORMATS[tool_format])
    parser.feed(text)
    parser.finish()
    if parser.mode != "calls":
        return result
    calls, reason = parser.calls, result.finish_reason
    if reason == "stop" and calls and not ToolSet.from_constraint(constraint).named:
        reason = seq.record.finish_reason = "tool_calls"
    return replace(result, tool_calls=tuple(calls), whole_calls=parser.complete, finish_reason=reason)
