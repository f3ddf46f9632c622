"""The tool-call format: a tool set from a request body, its grammar, and the calls read back
out of the text, whole or streamed (no server: the pieces the routes are built from)."""

from __future__ import annotations

import json

import pytest

from jupyter_infer.constraints.tools import CallParser, ToolSet, call_text, parse_calls
from jupyter_infer.errors import InvalidRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TWO = call_text("get_weather", '{"city":"Paris"}') + "\n" + call_text("get_weather", '{"city":"Rome"}')


def test_whole_answers_are_calls_or_text() -> None:
    content, calls = parse_calls(TWO)
    assert content is None and [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"}, {"city": "Rome"}]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert parse_calls("Sunny, 18 C.") == ("Sunny, 18 C.", [])
    assert parse_calls("") == ("", [])


def test_a_call_cut_short_is_not_among_the_calls() -> None:
    content, calls = parse_calls(TWO[: len(TWO) - 16])
    assert content is None and len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("size", [1, 2, 5, 13])
def test_streamed_pieces_add_up_to_the_whole(size: int) -> None:
    parser, deltas = CallParser(), []
    for i in range(0, len(TWO), size):
        deltas += parser.feed(TWO[i:i + size])
    deltas += parser.finish()
    starts = [d for d in deltas if d.id is not None]
    assert [d.name for d in starts] == ["get_weather", "get_weather"] and [d.index for d in starts] == [0, 1]
    args = {0: "", 1: ""}
    for d in deltas:
        args[d.index] += d.arguments or ""
    assert args == {0: '{"city":"Paris"}', 1: '{"city":"Rome"}'}
    assert all(d.content is None for d in deltas)


def test_the_grammar_follows_tool_choice() -> None:
    both = [WEATHER, {"type": "function", "function": {"name": "get_time"}}]
    required = ToolSet.from_body({"tools": both, "tool_choice": "required"})
    assert "start: calls\n" in required.lark() and '("\\n" call)*' in required.lark()
    named = ToolSet.from_body({"tools": both, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert named.named and "get_weather" not in named.lark() and '("\\n" call)*' not in named.lark()
    auto = ToolSet.from_body({"tools": both})
    assert "TEXT" in auto.lark()
    assert ToolSet.from_body({"tools": both, "tool_choice": "none"}) is None
    assert ToolSet.from_body({"tools": both, "parallel_tool_calls": False}).parallel is False
    # Arguments are closed to the declared keys; a tool with no parameters takes {}.
    assert '"additionalProperties": false' in required.lark()


@pytest.mark.parametrize(("body", "message"), [
    ({"tools": "x"}, "must be a list"),
    ({"tools": [{"type": "retrieval"}]}, "only function tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "'tool_choice' must be"),
    ({"tool_choice": "required"}, "has no 'tools'"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "true or false"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "JSON schema object"),
])
def test_bad_tool_sets_are_refused(body: dict, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ToolSet.from_body(body)


def test_legacy_functions_are_tools_without_parallel_calls() -> None:
    tools = ToolSet.from_body({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}})
    assert tools.choice == "get_weather" and not tools.parallel


def test_null_means_the_default() -> None:
    assert ToolSet.from_body({"tools": [WEATHER], "parallel_tool_calls": None, "tool_choice": None}).parallel


def test_an_upstream_gets_the_schema_as_sent() -> None:
    """Name and strict go upstream as the client sent them (strict only when it said so)."""
    from jupyter_infer.constraints.spec import from_body
    from jupyter_infer.wire.upstream_openai import constraint_fields

    loose = constraint_fields(from_body({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}}))
    assert loose == {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                 "schema": {"type": "object"}}}}
    strict = constraint_fields(from_body({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}, "strict": True}}}))
    assert strict["response_format"]["json_schema"]["strict"] is True
    assert constraint_fields(from_body({"guided_regex": "a+"})) == {"structured_outputs": {"regex": "a+"}}


@pytest.mark.parametrize("size", [1, 3, 100])
def test_arguments_that_hold_the_closing_tag_in_a_string_stay_whole(size: int) -> None:
    """Found in review: '}</tool_call>' inside a string ended the call there."""
    tricky = json.dumps({"s": 'x}</tool_call>y \\ " }', "n": [{"a": "]"}]}, separators=(",", ":"))
    text = call_text("get_weather", tricky)
    parser = CallParser()
    for i in range(0, len(text), size):
        parser.feed(text[i:i + size])
    parser.finish()
    assert parser.complete == 1 and json.loads(parser.calls[0]["function"]["arguments"]) == json.loads(tricky)


def test_references_in_tool_parameters_resolve_where_they_were_written(tiny_model_dir) -> None:
    """Found in review: a tool's "#"-relative $ref resolved against the call wrapper."""
    from jupyter_infer.engine.hf import HFEngine

    tree = {"type": "function", "function": {"name": "tree", "parameters": {
        "type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"},
                                                                             "maxItems": 2}},
        "required": ["v"], "$defs": {"unused": {"type": "null"}}}}}
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    grammar = engine.grammars.compile(ToolSet.from_body({"tools": [tree], "tool_choice": "required"}).constraint())

    def fits(arguments: dict) -> bool:
        row = grammar.row()
        text = call_text("tree", json.dumps(arguments))  # laid out as templates' tojson writes it
        return row.matcher.consume_tokens(engine.text.tokenize(text)) and row.matcher.is_accepting()

    assert fits({"v": 1, "kids": [{"v": 2, "kids": []}]})
    assert not fits({"v": 1, "kids": [{"name": "tree", "arguments": {"v": 2}}]})


def test_closing_a_schema_walks_subschemas_only() -> None:
    """Found in review: allOf branches were closed (refusing each other's keys) and a const
    value with a "properties" key was rewritten."""
    from jupyter_infer.constraints.spec import closed_schema

    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "c": {"const": {"properties": 1}},
        "m": {"allOf": [{"properties": {"p": {}}}, {"properties": {"q": {}}}]},
        "l": {"type": "array", "items": {"properties": {"y": {}}}}}}
    out = closed_schema(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"] == {"const": {"properties": 1}}
    assert all("additionalProperties" not in b for b in out["properties"]["m"]["allOf"])
    assert out["properties"]["l"]["items"]["additionalProperties"] is False
    assert schema["properties"]["a"] == {"type": "object", "properties": {"x": {"type": "integer"}}}  # not changed


def test_parallel_results_are_one_user_turn() -> None:
    from jupyter_infer.wire.chat import parse_messages

    chat = parse_messages({"messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "b", "content": "21 C"}]})
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[1]["content"] == TWO
    assert chat[2]["content"] == "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n21 C\n</tool_response>"


def test_a_cut_call_is_kept_when_asked() -> None:
    content, calls = parse_calls(TWO[: len(TWO) - 17], cut=True)
    assert content is None and len(calls) == 2 and calls[1]["function"]["arguments"] == '{"city":"Rom'
    # Cut in the closing tag only: the arguments are whole, and so is the call.
    assert len(parse_calls(TWO[: len(TWO) - 9])[1]) == 2


def test_an_upstream_gets_the_conversation_as_sent() -> None:
    """Found in review: an upstream got our tool prompt and flattened history besides the
    tools field; it gets the client's messages and renders them its own way."""
    from jupyter_infer.wire.native import parse_generate
    from jupyter_infer.wire.upstream_openai import request_body

    sent = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"P"}'}}]},
            {"role": "tool", "tool_call_id": "a", "content": "18 C"}]
    request = parse_generate({"messages": sent, "tools": [WEATHER]}, max_new_tokens=64)
    assert request.messages[0]["role"] == "system" and "<tool_call>" in request.messages[2]["content"]
    _, body = request_body(request, "m")
    assert body["messages"] == sent and body["tools"][0]["function"]["name"] == "get_weather"
    plain = parse_generate({"messages": [{"role": "user", "content": "hi"}]}, max_new_tokens=64)
    assert request_body(plain, "m")[1]["messages"] == [{"role": "user", "content": "hi"}]


def test_tool_arguments_keep_seconds_below_60_and_const_values_stay() -> None:
    from jupyter_infer.constraints.spec import seconds_below_60

    tools = ToolSet.from_body({"tools": [{"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}}}],
        "tool_choice": "required"})
    assert "[0-5][0-9]:[0-5][0-9]" in tools.lark()
    assert seconds_below_60({"const": {"format": "time"}}) == {"const": {"format": "time"}}
