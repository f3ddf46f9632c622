"""The simulated engine runs an agent loop with no model, through the OpenAI API: a tool the
user names is called, its string arguments from the message's quoted words; after the tool's
result, or when no tool is named, the answer is text."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

WRITE = {"type": "function", "function": {
    "name": "write", "description": "Write a file.",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["file_path", "content"]}}}
COUNT = {"type": "function", "function": {
    "name": "count", "description": "Count up to n.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}


async def test_a_named_tool_is_called_with_the_quoted_words(client: Any) -> None:
    said = 'Don\'t wait: please write `notes.txt` with "hello from a notebook", it\'s late.'  # apostrophes aside
    answer = await client.chat.completions.create(
        model="simulated", messages=[{"role": "user", "content": said}], tools=[COUNT, WRITE])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    assert call.name == "write"
    assert json.loads(call.arguments) == {"file_path": "notes.txt", "content": "hello from a notebook"}


async def test_after_the_result_the_answer_is_text(client: Any) -> None:
    said = "write `a.txt` with `hi`"
    first = (await client.chat.completions.create(
        model="simulated", messages=[{"role": "user", "content": said}], tools=[WRITE])).choices[0].message
    messages = [{"role": "user", "content": said}, first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "written"}]
    second = (await client.chat.completions.create(model="simulated", messages=messages, tools=[WRITE])).choices[0]
    assert second.finish_reason == "stop" and not second.message.tool_calls and second.message.content


async def test_no_tool_named_is_a_text_answer_and_required_still_calls(client: Any) -> None:
    messages = [{"role": "user", "content": "What is the KV cache?"}]
    text = (await client.chat.completions.create(model="simulated", messages=messages, tools=[COUNT, WRITE])).choices[0]
    assert text.finish_reason == "stop" and "cache" in text.message.content.lower()
    # All of the composed answer (40 words or more), not a string's 12 tokens.
    assert len(text.message.content.split()) >= 40 and text.message.content.endswith(".")
    due = (await client.chat.completions.create(model="simulated", messages=messages, tools=[COUNT, WRITE],
                                                 tool_choice="required")).choices[0]
    call = due.message.tool_calls[0].function
    assert call.name == "count" and isinstance(json.loads(call.arguments)["n"], int)  # the grammar wrote n


async def test_a_tool_name_inside_a_word_is_not_named(client: Any) -> None:
    messages = [{"role": "user", "content": "Our rewrite counts as a recount."}]
    answer = (await client.chat.completions.create(model="simulated", messages=messages, tools=[COUNT, WRITE])).choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls


async def test_a_chat_is_answered_about_its_users_last_message(client: Any) -> None:
    """A long system prompt about other things (Jupyternaut's: agents, notebooks, tools) does
    not steer the answer: the browser pass found its replies about agents and notebooks."""
    system = "You are an AI agent in Jupyter notebooks. " * 40 + "Agents call tools; notebooks run cells."
    question = {"role": "user", "content": "What is the KV cache?"}
    steered = await client.chat.completions.create(
        model="simulated", messages=[{"role": "system", "content": system}, question], tools=[WRITE], temperature=0)
    alone = await client.chat.completions.create(model="simulated", messages=[question], temperature=0)
    first = steered.choices[0].message.content.split(". ")[0]
    assert "cache" in first.lower(), steered.choices[0].message.content
    assert steered.choices[0].message.content == alone.choices[0].message.content


async def test_a_tool_calls_record_says_tool_calls_in_infer_batches(client: Any, jp_fetch: Any) -> None:
    """The engine finishes a call's tokens as "stop"; the answer says "tool_calls", and so must
    the record ``infer/batches`` shows (the panels and timelines read it)."""
    said = [{"role": "user", "content": "write `a.txt` with `hi`"}]
    whole = await client.chat.completions.create(model="simulated", messages=said, tools=[WRITE])
    streamed = [chunk async for chunk in await client.chat.completions.create(
        model="simulated", messages=said, tools=[WRITE], stream=True)]
    text = await client.chat.completions.create(
        model="simulated", messages=[{"role": "user", "content": "What is the KV cache?"}], tools=[WRITE])
    assert [whole.choices[0].finish_reason, streamed[-1].choices[0].finish_reason, text.choices[0].finish_reason] \
        == ["tool_calls", "tool_calls", "stop"]
    records = json.loads((await jp_fetch("infer", "batches")).body)["requests"]
    assert [r["finish_reason"] for r in records[-3:]] == ["tool_calls", "tool_calls", "stop"]


async def test_the_native_answer_carries_the_calls_the_server_read(jp_fetch: Any) -> None:
    """``infer/generate`` with tools answers with the calls, read once on the server (the
    notebook client no longer reads them from the text); cut short by max_tokens, a call is
    not callable and the answer stays text."""
    said = [{"role": "user", "content": "write `a.txt` with `hi`"}]

    async def generate(**extra: Any) -> dict[str, Any]:
        body = {"messages": said, "tools": [WRITE], "temperature": 0, **extra}
        return json.loads((await jp_fetch("infer", "generate", method="POST", body=json.dumps(body))).body)

    whole, cut = await generate(max_tokens=200), await generate(max_tokens=8)
    assert whole["finish_reason"] == "tool_calls", whole
    assert [json.loads(c["function"]["arguments"]) for c in whole["tool_calls"]] == [
        {"file_path": "a.txt", "content": "hi"}]
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut and cut["text"], cut
