"""The answer stage: one place reads an answer into reasoning, content and tool calls, as it
streams and whole, and decides its finish reason before the core retires it."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import pytest

from jupyter_infer.constraints.tools import ToolSet
from jupyter_infer.loops.answer_stage import AnswerStage
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Sequence

EOS = 0
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


class CharTokenizer:
    """Token ``n`` is the character ``chr(n)``; 0 is EOS."""

    eos_token_ids = frozenset({EOS})

    @staticmethod
    def detokenize(ids: Seq[int]) -> str:
        return "".join(chr(i) for i in ids)


def chat(max_tokens: int = 200, choice: str | None = None, opened: bool = False, tools: bool = True) -> Sequence:
    constraint = None
    if tools:
        body = {"tools": [WEATHER], **({"tool_choice": choice} if choice else {})}
        constraint = ToolSet.from_body(body).constraint()
    request = Request("", SamplingParams(max_tokens=max_tokens, constraint=constraint),
                      messages=[{"role": "user", "content": "hi"}], opened_reasoning=opened)
    return Sequence(request, [1, 2, 3])


def run(stage: AnswerStage, seq: Sequence, text: str, size: int = 3) -> list:
    """Feed ``text`` (then EOS) a few tokens at a time; every piece the answer gained."""
    ids = [ord(c) for c in text] + [EOS]
    pieces = []
    for at in range(0, len(ids), size):
        _, event = stage.take(seq, ids[at:at + size], None, 0.0)
        pieces += event.pieces if event is not None else []
        if seq.finish_reason is not None:
            break
    return pieces


CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("size", [1, 4, 50])
def test_reasoning_then_calls_come_as_pieces_and_the_record_says_tool_calls(size: int) -> None:
    stage, seq = AnswerStage(CharTokenizer()), chat()
    stage.open(seq, "hermes", reasons=True)
    pieces = run(stage, seq, "<think>rain?</think>\n\n" + CALL, size)
    # Decided here, before the core retires the row: infer/batches and events say it too.
    assert seq.record.finish_reason == "tool_calls"
    assert "".join(p.text for p in pieces if p.kind == "reasoning") == "rain?"
    assert not [p for p in pieces if p.kind == "content"]
    calls = [p for p in pieces if p.kind == "call"]
    assert calls[0].opens_call and calls[0].name == "weather"
    assert "".join(p.text for p in calls) == '{"city": "Oslo"}'
    result = stage.result(seq)
    assert result.reasoning == "rain?" and result.content is None and result.whole_calls == 1
    assert result.tool_calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert result.text.startswith("<think>")  # the text as written stays whole (the native routes)


def test_a_prompt_that_opened_the_section_starts_inside_it() -> None:
    stage, seq = AnswerStage(CharTokenizer()), chat(tools=False, opened=True)
    stage.open(seq, "hermes", reasons=True)
    pieces = run(stage, seq, "hmm</think>\n\nIt rains.")
    assert pieces[0].kind == "reasoning"  # no <think> came: the prompt opened it
    result = stage.result(seq)
    assert (result.reasoning, result.content, result.finish_reason) == ("hmm", "It rains.", "stop")


def test_a_named_tool_keeps_stop_and_text_stays_content() -> None:
    stage, named = AnswerStage(CharTokenizer()), chat(choice="required")
    stage.open(named, "hermes", reasons=False)
    run(stage, named, CALL)
    assert named.finish_reason == "tool_calls"  # required is not a name
    forced = chat(choice={"type": "function", "function": {"name": "weather"}})  # named: OpenAI keeps "stop"
    stage.open(forced, "hermes", reasons=False)
    run(stage, forced, CALL)
    assert forced.finish_reason == "stop" and stage.result(forced).tool_calls is not None
    text = chat()
    stage.open(text, "hermes", reasons=False)
    assert "".join(p.text for p in run(stage, text, "Sunny.")) == "Sunny."
    assert (text.finish_reason, stage.result(text).content, stage.result(text).tool_calls) == ("stop", "Sunny.", None)


def test_a_call_cut_by_max_tokens_streams_what_it_had_and_says_length() -> None:
    stage, seq = AnswerStage(CharTokenizer()), chat(max_tokens=52)  # inside the arguments
    stage.open(seq, "hermes", reasons=False)
    pieces = run(stage, seq, CALL)
    result = stage.result(seq)
    assert result.finish_reason == "length" and result.whole_calls == 0
    streamed = "".join(p.text for p in pieces if p.kind == "call")
    assert streamed == result.tool_calls[0]["function"]["arguments"] == '{"city"'


def test_an_upstream_answer_is_read_the_same_way() -> None:
    stage, seq = AnswerStage(), chat()
    stage.open(seq, "hermes", reasons=False)
    pieces = []
    for at in range(0, len(CALL), 7):
        seq.text += CALL[at:at + 7]
        event = stage.take_text(seq, CALL[at:at + 7], -1)
        pieces += event.pieces if event is not None else []
    reason, last = stage.end_text(seq, "stop", -1)
    assert reason == "tool_calls"
    assert "".join(p.text for p in pieces + list(last.pieces if last else ()) if p.kind == "call") == '{"city": "Oslo"}'
