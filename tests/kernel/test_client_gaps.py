"""What agent frameworks tripped on (issue 31), through the real clients against the real server
on the tiny model (512 tokens of context): a prompt past the context is OpenAI's
``context_length_exceeded`` (LangChain raises its ``ContextOverflowError``), an unknown model is
a 404, legacy ``functions`` get ``message.function_call`` back, and tools beside a
``response_format`` answer with calls or an object that fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai_fixtures import engine_options
from server_helpers import TOKEN

pytestmark = pytest.mark.timeout(180)

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                          "required": ["city"]}}
FORECAST = {"type": "object", "properties": {"degrees": {"type": "integer", "minimum": 0, "maximum": 40},
                                             "sunny": {"type": "boolean"}},
            "required": ["degrees", "sunny"], "additionalProperties": False}


@pytest.fixture
def infer_options(tiny_model_dir: Path) -> dict[str, Any]:
    return engine_options("hf", tiny_model_dir)


async def test_past_the_context_is_context_length_exceeded(client: openai.AsyncOpenAI, base_url: str) -> None:
    long = "the cat sat on the mat " * 120  # ~700 tokens: past the 512 of context
    with pytest.raises(openai.BadRequestError) as seen:  # no max_tokens: nothing is left for an answer
        await client.chat.completions.create(model="default", messages=[{"role": "user", "content": long}])
    assert seen.value.code == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in seen.value.message and "max_tokens (1)" not in seen.value.message
    with pytest.raises(openai.BadRequestError) as seen:  # under the server's limit: the context is what binds
        await client.completions.create(model="default", prompt=" a" * 2200)  # under the character bound
    assert seen.value.code == "context_length_exceeded", seen.value.message
    with pytest.raises(openai.BadRequestError) as seen:  # the prompt fits, the answer asked for does not
        await client.completions.create(model="default", prompt="the cat sat " * 60, max_tokens=400)
    assert seen.value.code == "context_length_exceeded" and "ask for at most" in seen.value.message

    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=base_url, api_key=TOKEN, model="default", max_retries=0)
    with pytest.raises(ContextOverflowError):
        await chat.ainvoke(long)


async def test_an_unknown_model_is_a_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as seen:
        await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert seen.value.code == "model_not_found" and "not served here" in seen.value.message


async def test_legacy_functions_are_answered_as_function_call(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    answer = await client.chat.completions.create(model="default", messages=messages, functions=[WEATHER],
                                                  function_call={"name": "get_weather"}, max_tokens=120, temperature=0)
    message = answer.choices[0].message
    assert message.tool_calls is None and message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(message.function_call.arguments), WEATHER["parameters"])
    stream = await client.chat.completions.create(model="default", messages=messages, functions=[WEATHER],
                                                  function_call={"name": "get_weather"}, max_tokens=120, temperature=0,
                                                  stream=True)
    names, arguments, reasons = [], "", []
    async for chunk in stream:
        delta = chunk.choices[0].delta
        assert not delta.tool_calls
        if delta.function_call is not None:
            names += [delta.function_call.name] if delta.function_call.name else []
            arguments += delta.function_call.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_weather"] and json.loads(arguments) == json.loads(message.function_call.arguments)
    assert reasons[-1] == "stop"  # a named function: called because it was told to (OpenAI's)


async def test_a_required_tool_choice_without_tools_says_so(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'tool_choice' is 'required', but the request has no 'tools'"):
        await client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                             tool_choice="required")


@pytest.mark.parametrize("prompt", ["Weather in Oslo?", "Is it sunny today?", "Forecast, please.", "Hello"])
async def test_tools_beside_a_response_format_answer_with_calls_or_an_object_that_fits(
        client: openai.AsyncOpenAI, prompt: str) -> None:
    """The OpenAI Agents SDK's ``Agent(tools=[...], output_type=Model)`` sends both: its first
    turn got a 400 ("A request with tools cannot also constrain its text")."""
    answer = await client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": prompt}], max_tokens=60, temperature=0,
        tools=[{"type": "function", "function": WEATHER}],
        response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": FORECAST}})
    choice = answer.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["parameters"])
    else:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), FORECAST)


@pytest.mark.slow
def test_the_packages_logs_reach_the_servers_log_with_time_and_level(tmp_path: Path) -> None:
    """An ignored field is logged once, by ``jupyter_infer.wire.openai_requests``: before,
    no handler took it (INFO dropped; a warning printed bare on stderr)."""
    import re

    import httpx

    from jupyter_infer.kernel.launcher import LocalServer

    log = tmp_path / "server.log"
    with LocalServer(engine="simulated", simulated_token_delay_ms=[0, 1], log_path=str(log)) as server:
        answer = httpx.post(f"{server.url}infer/v1/completions", headers=server.headers, timeout=30,
                            json={"prompt": "hi", "max_tokens": 2, "frobnicate": 1})
        assert answer.status_code == 200
    lines = [line for line in log.read_text().splitlines() if "frobnicate" in line]
    assert len(lines) == 1 and re.match(r"\[I \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", lines[0]), lines
