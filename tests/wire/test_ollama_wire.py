"""Ollama's bodies in and answers out, without a server: ``keep_alive`` durations, the names a
model goes by, a chat's messages as the chat route reads them, generate's two translations, and
the streamed lines (thinking, text, tool calls whole) as the ollama client's own models read them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from ollama import ChatResponse, GenerateResponse

from jupyter_infer.errors import InvalidRequest
from jupyter_infer.values.answer import AnswerPiece
from jupyter_infer.values.engine_info import EngineInfo
from jupyter_infer.values.request import RequestResult
from jupyter_infer.wire import ollama_answers
from jupyter_infer.wire.ollama_api import (
    OllamaCall,
    chat_messages,
    keep_alive,
    name_candidates,
    parse_chat_call,
    parse_generate_call,
)

INFO = EngineInfo(engine="simulated", model="simulated", device="cpu", dtype="n/a", max_context=2048)


@pytest.mark.parametrize(("sent", "seconds"), [(0, 0.0), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0),
                                               ("300ms", 0.3), (10, 10.0), ("2.5", 2.5), (-1, math.inf),
                                               ("-1m", math.inf), (None, None)])
def test_keep_alive_reads_seconds_and_go_durations(sent: Any, seconds: float | None) -> None:
    assert keep_alive(sent) == seconds


@pytest.mark.parametrize("sent", ["soon", "5 minutes", True, [1], "nan", "m5"])
def test_keep_alive_refuses_what_is_not_a_duration(sent: Any) -> None:
    with pytest.raises(InvalidRequest, match="keep_alive"):
        keep_alive(sent)


def test_names_with_and_without_the_default_tag() -> None:
    assert name_candidates("tiny:latest") == ["tiny:latest", "tiny"]
    assert name_candidates("llama3.2") == ["llama3.2", "llama3.2:latest"]
    assert name_candidates("qwen2.5:0.5b") == ["qwen2.5:0.5b"]
    assert name_candidates("Qwen/Qwen2.5-0.5B") == ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B:latest"]


def test_tool_results_answer_their_calls_by_name() -> None:
    """Two calls, answered in the other order: each result gets its own call's id."""
    messages = chat_messages([
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "thinking": "Two tools.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny"},
    ])
    calls = messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"city": "Paris"}'] * 2  # JSON text, as OpenAI's
    assert "thinking" not in messages[1]  # an earlier turn's reasoning is not read again
    assert [m["tool_call_id"] for m in messages[2:]] == [calls[1]["id"], calls[0]["id"]]
    assert [m["name"] for m in messages[2:]] == ["get_time", "get_weather"]


def test_generate_is_a_chat_turn_or_the_raw_prompt() -> None:
    body = {"model": "simulated", "prompt": "Hi", "system": "Be brief.", "options": {"num_predict": 5, "num_ctx": 8}}
    chat = parse_generate_call(body, INFO, "simulated", max_new_tokens=64)
    assert chat.request is not None and not chat.chat and chat.stream  # Ollama streams by default
    assert chat.request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat.request.params.max_tokens == 5 and chat.ignored == ["options.num_ctx"]
    raw = parse_generate_call({**body, "raw": True, "options": {}}, INFO, "simulated", max_new_tokens=64)
    assert raw.request is not None and raw.request.prompt == "Hi" and raw.request.messages is None
    assert raw.request.params.max_tokens is None  # as much as fits, not the completions route's 16
    assert raw.ignored == ["system"]  # a raw prompt is the model's whole input
    loading = parse_generate_call({"model": "simulated:latest"}, INFO, "simulated", max_new_tokens=64)
    assert loading.request is None and loading.model == "simulated:latest"


def test_chat_options_and_format_reach_the_request() -> None:
    body = {"model": "simulated", "messages": [{"role": "user", "content": "Hi"}], "stream": False, "format": "json",
            "options": {"temperature": 0, "top_k": 5, "seed": 3, "stop": ["\n"], "repeat_penalty": 1.2,
                        "num_predict": -1}, "keep_alive": "5m"}
    call = parse_chat_call(body, INFO, "simulated", max_new_tokens=64)
    params = call.request.params
    assert (params.temperature, params.top_k, params.seed, params.stop) == (0.0, 5, 3, ("\n",))
    assert params.repetition_penalty == 1.2 and params.max_tokens is None
    assert params.constraint is not None and params.constraint.kind == "json_object"
    assert not call.stream and call.keep_alive_s == 300.0 and call.ignored == ["keep_alive"]


def _result(**kw: Any) -> RequestResult:
    return RequestResult("req-1", "", kw.pop("finish_reason", "stop"), 7, 9, None, 1, 1.0, 3.0, 10.0, **kw)


def test_streamed_lines_as_the_client_reads_them() -> None:
    """Thinking and text at once, each call whole once the next piece shows it ended (the last
    at the end), arguments as objects; the whole answer says the same."""
    calls = ({"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}})
    result = _result(finish_reason="tool_calls", reasoning="Let me think.", content="Sure.", tool_calls=calls,
                     whole_calls=2)
    call = OllamaCall(None, "m:latest", chat=True)
    lines = ollama_answers.AnswerLines(call)
    pieces = [AnswerPiece("reasoning", "Let me "), AnswerPiece("reasoning", "think."), AnswerPiece("content", "Sure."),
              AnswerPiece("call", "", 0, "call_a", "get_weather"), AnswerPiece("call", '{"city": ', 0),
              AnswerPiece("call", '"Oslo"}', 0), AnswerPiece("call", '{"city": "Rome"}', 1, "call_b", "get_weather")]
    out = [*lines.pieces(tuple(pieces[:3])), *lines.pieces(tuple(pieces[3:])), *lines.end(result, 0.02, 0.001)]
    chunks = [ChatResponse.model_validate(line) for line in out]
    assert "".join(c.message.thinking or "" for c in chunks) == "Let me think."
    assert "".join(c.message.content or "" for c in chunks) == "Sure."
    streamed = [tc for c in chunks for tc in c.message.tool_calls or []]
    assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [
        ("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert (last.done_reason, last.prompt_eval_count, last.eval_count) == ("stop", 7, 9)
    assert (last.total_duration, last.load_duration, last.prompt_eval_duration, last.eval_duration) == (
        20_000_000, 1_000_000, 2_000_000, 7_000_000)
    whole = ChatResponse.model_validate(ollama_answers.answer(call, result, 0.02, 0.001))
    assert whole.message.thinking == "Let me think." and whole.message.content == "Sure."
    assert [tc.function.arguments for tc in whole.message.tool_calls] == [{"city": "Oslo"}, {"city": "Rome"}]


def test_a_generate_answer_and_its_length_reason() -> None:
    call = OllamaCall(None, "m", chat=False)
    answer = GenerateResponse.model_validate(
        ollama_answers.answer(call, _result(finish_reason="length", content="abc"), 0.01, 0.0))
    assert (answer.response, answer.done_reason, answer.done) == ("abc", "length", True)
    assert ollama_answers.loaded(call, "load") | {"created_at": ""} == {
        "model": "m", "created_at": "", "response": "", "done": True, "done_reason": "load"}
