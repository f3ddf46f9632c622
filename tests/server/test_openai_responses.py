"""OpenAI's Responses API (``infer/v1/responses``), driven by the official ``openai`` client over
a real port: text and function calls, whole and streamed (the SDK's own stream parser reads our
events and raises on a malformed one), structured output, stored responses chained, read and
deleted per user, errors in OpenAI's shape; the openai-agents SDK's default model running an
agent with a tool; and the same answer as the chat route for the same chat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models import _openai_shared
from agents.models.multi_provider import MultiProvider
from agents.models.openai_responses import OpenAIResponsesModel
from jupyter_server.auth import IdentityProvider, User
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel
from server_helpers import POISON, TOKEN, parse_sse, server_config, service_of, use_scripted_engine

from jupyter_infer.values.answer import AnswerPiece
from jupyter_infer.values.request import RequestResult
from jupyter_infer.wire.openai_responses import ResponsesCall, ResponseShape
from jupyter_infer.wire.responses_events import ResponseEvents

pytestmark = pytest.mark.timeout(180)

BOB = "bob-token-0123456789"
USERS = {TOKEN: "alice", BOB: "bob"}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}
ASK = "What is a KV cache?"
CALL_PARIS = 'Call get_weather for "Paris" please.'


class TokenUsers(IdentityProvider):
    """Each token is one user, as on JupyterHub: the test's token is alice's, ``BOB`` bob's."""

    async def get_user(self, handler: Any) -> User | None:
        header = handler.request.headers.get("Authorization", "")
        name = USERS.get(header.split(" ", 1)[1] if " " in header else "")
        if name is None:
            return None
        handler._token_authenticated = True  # a token, not a cookie: no XSRF proof needed
        return User(name)


@pytest.fixture
def infer_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The simulated engine (scripted: tests/server_helpers.py), or, parametrized ``"hf"``
    (``indirect=True``), the hf engine on the tiny locally built model."""
    if getattr(request, "param", None) == "hf":
        model: Path = request.getfixturevalue("tiny_model_dir")
        return {"engine": "hf", "model": str(model), "dtype": "float32", "num_threads": 1, "max_new_tokens": 64}
    return {"max_new_tokens": 256}


@pytest.fixture
def jp_server_config(infer_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    if infer_options.get("engine", "simulated") == "simulated":
        use_scripted_engine(monkeypatch)
    config = server_config(**infer_options)
    config["ServerApp"]["identity_provider_class"] = TokenUsers
    return config


@pytest.fixture
def bob(base_url: str, jp_asyncio_loop: Any) -> Any:
    api = openai.AsyncOpenAI(base_url=base_url, api_key=BOB, max_retries=0, timeout=60)
    yield api
    jp_asyncio_loop.run_until_complete(api.close())


async def stream_of(client: openai.AsyncOpenAI, **kw: Any) -> tuple[str, Response, list[str]]:
    """The streamed text deltas joined, the SDK's final response, and the events' types."""
    kinds, text = [], ""
    async with client.responses.stream(**kw) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = await stream.get_final_response()
    return text, final, kinds


def calls_of(response: Response) -> list[tuple[str, Any]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


# -- text ------------------------------------------------------------------------------------------
async def test_text_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    kw = {"model": "simulated", "input": ASK, "instructions": "Be brief.", "temperature": 0,
          "max_output_tokens": 200, "metadata": {"who": "test"}}
    whole = await client.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.status == "completed"
    assert [item.type for item in whole.output] == ["message"] and whole.output_text
    assert whole.output[0].content[0].type == "output_text" and whole.output[0].role == "assistant"
    assert whole.instructions == "Be brief." and whole.metadata == {"who": "test"} and whole.temperature == 0
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 200
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    text, final, kinds = await stream_of(client, **kw)
    assert text == final.output_text == whole.output_text
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens
    assert (await client.responses.retrieve(final.id)).output_text == text  # a streamed answer is stored too
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]


async def test_the_wire_of_a_stream(http: httpx.AsyncClient) -> None:
    """Every event named as its ``type``, numbered in order from 0, one item's ids throughout."""
    body = {"model": "simulated", "input": ASK, "stream": True, "max_output_tokens": 5}
    async with http.stream("POST", "responses", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events, _ = parse_sse(text)
    data = [json.loads(e.data) for e in events]
    assert [d["type"] for d in data] == [e.event for e in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[0]["response"]["status"] == "in_progress" and data[0]["response"]["output"] == []
    last = data[-1]["response"]  # five tokens of a longer answer: incomplete
    assert data[-1]["type"] == "response.incomplete" and last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["usage"]["output_tokens"] == 5 and last["output"][0]["status"] == "incomplete"
    deltas = [d for d in data if d["type"] == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == last["output"][0]["content"][0]["text"]
    assert {d["item_id"] for d in deltas} == {last["output"][0]["id"]}


async def test_max_output_tokens_is_incomplete(client: openai.AsyncOpenAI) -> None:
    answer = await client.responses.create(model="simulated", input=ASK, max_output_tokens=3)
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.output_tokens == 3 and answer.output_text


# -- tools -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", [None, "required", {"type": "function", "name": "get_weather"}])
async def test_a_function_call_whole_and_streamed(client: openai.AsyncOpenAI, choice: Any) -> None:
    kw: dict[str, Any] = {"model": "simulated", "input": CALL_PARIS, "tools": [WEATHER], "max_output_tokens": 60}
    if choice is not None:
        kw["tool_choice"] = choice
    whole = await client.responses.create(**kw)
    assert calls_of(whole) == [("get_weather", {"city": "Paris"})] and whole.status == "completed"
    call = whole.output[-1]
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"
    assert whole.tools[0].name == "get_weather" and whole.parallel_tool_calls
    _, final, kinds = await stream_of(client, **kw)
    assert calls_of(final) == [("get_weather", {"city": "Paris"})]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds


async def test_a_function_call_output_round_trip(client: openai.AsyncOpenAI) -> None:
    """The call comes back as input items with its output, or as its output after the stored
    call (previous_response_id); the model then answers in text, the same both ways."""
    first = await client.responses.create(model="simulated", input=CALL_PARIS, tools=[WEATHER], temperature=0)
    call = first.output[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    items = [{"role": "user", "content": CALL_PARIS}, call.model_dump(exclude_none=True), output]
    answer = await client.responses.create(model="simulated", input=items, tools=[WEATHER], max_output_tokens=20,
                                           temperature=0, store=False)
    assert [item.type for item in answer.output] == ["message"] and answer.output_text
    chained = await client.responses.create(model="simulated", input=[output], previous_response_id=first.id,
                                            tools=[WEATHER], max_output_tokens=20, temperature=0)
    assert chained.output_text == answer.output_text and chained.usage.input_tokens == answer.usage.input_tokens
    with pytest.raises(openai.NotFoundError):  # store: false kept nothing
        await client.responses.retrieve(answer.id)


# -- structured output -----------------------------------------------------------------------------
class Verdict(BaseModel):
    ok: bool
    reason: str


async def test_text_format_json_schema_constrains_the_text(client: openai.AsyncOpenAI) -> None:
    parsed = await client.responses.parse(model="simulated", input=ASK, text_format=Verdict, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Verdict)  # the SDK validated it against the model
    loose = await client.responses.create(model="simulated", input=ASK, max_output_tokens=60,
                                          text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(loose.output_text), dict)


# -- stored responses --------------------------------------------------------------------------------
async def test_previous_response_id_chains_and_is_each_users_own(
    client: openai.AsyncOpenAI, bob: openai.AsyncOpenAI, http: httpx.AsyncClient,
) -> None:
    first = await client.responses.create(model="simulated", input="SHORT please", temperature=0)
    assert first.output_text == "one two\nthree"  # the scripted answer
    second = await client.responses.create(model="simulated", input="And what is attention?",
                                           previous_response_id=first.id, temperature=0, max_output_tokens=8)
    alone = await client.responses.create(model="simulated", input="And what is attention?", temperature=0,
                                          max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens  # it read the first turn
    got = await client.responses.retrieve(second.id)
    assert got.output_text == second.output_text and got.usage == second.usage
    items = (await http.get(f"responses/{second.id}/input_items", params={"order": "asc"})).json()["data"]
    assert [i.get("role") for i in items] == ["user", "assistant", "user"]
    with pytest.raises(openai.NotFoundError):  # bob sees none of alice's
        await bob.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        await bob.responses.create(model="simulated", input="hi", previous_response_id=first.id)
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        await bob.responses.delete(first.id)
    deleted = await http.delete(f"responses/{first.id}")
    assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)


# -- the openai-agents SDK ---------------------------------------------------------------------------
async def test_an_agent_with_a_tool_on_the_agents_sdk_default_model(
    client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent on the Agents SDK's default model (``OpenAIResponsesModel``: this route) calls
    its tool, reads the tool's output back and answers, whole and streamed."""

    monkeypatch.setattr(_openai_shared, "_default_openai_client", _openai_shared.get_default_openai_client())
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"Sunny in {city}, 21 C"

    set_tracing_disabled(True)
    set_default_openai_client(client, use_for_tracing=False)
    agent = Agent(name="weather", instructions="Answer about the weather.", tools=[get_weather], model="simulated",
                  model_settings=ModelSettings(temperature=0))
    result = await Runner.run(agent, CALL_PARIS)
    assert asked == ["Paris"] and isinstance(result.final_output, str) and result.final_output
    assert [r.type for r in result.new_items] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(agent.model, str) and len(result.raw_responses) == 2
    streamed = Runner.run_streamed(agent, CALL_PARIS)
    async for _ in streamed.stream_events():
        pass
    assert asked == ["Paris", "Paris"] and streamed.final_output == result.final_output
    assert isinstance(MultiProvider().get_model("simulated"), OpenAIResponsesModel)  # the default model


# -- the same chat through both routes ---------------------------------------------------------------
CHAT = [{"role": "system", "content": "You answer about the weather."},
        {"role": "user", "content": 'What is the weather in "Paris"?'},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_01", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_01", "content": "Sunny, 21 C"},
        {"role": "user", "content": "Thanks. Say it in one line."}]
ITEMS = [{"role": "user", "content": [{"type": "input_text", "text": 'What is the weather in "Paris"?'}]},
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
         {"type": "function_call", "call_id": "call_01", "name": "get_weather", "arguments": '{"city": "Paris"}'},
         {"type": "function_call_output", "call_id": "call_01", "output": "Sunny, 21 C"},
         {"role": "user", "content": "Thanks. Say it in one line."}]
CHAT_WEATHER = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}


@pytest.mark.parametrize("infer_options", ["simulated", "hf"], indirect=True)
async def test_the_dialect_costs_nothing(client: openai.AsyncOpenAI) -> None:
    """The same chat (instructions, a call, its output, tools) through chat completions and
    Responses at temperature 0: the same prompt tokens, the same answer."""
    served = (await client.models.list()).data[0].id
    chat = await client.chat.completions.create(model=served, messages=CHAT, tools=[CHAT_WEATHER], max_tokens=10,
                                                temperature=0)
    answer = await client.responses.create(model=served, instructions="You answer about the weather.", input=ITEMS,
                                           tools=[WEATHER], max_output_tokens=10, temperature=0)
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    assert answer.usage.output_tokens == chat.usage.completion_tokens
    said = chat.choices[0].message
    if said.tool_calls:  # the tiny random model may call the tool: the same call
        assert calls_of(answer) == [(c.function.name, json.loads(c.function.arguments)) for c in said.tool_calls]
    else:
        assert answer.output_text == said.content


# -- reasoning: the answer stage's reasoning as a reasoning item ----------------------------------
def test_reasoning_text_and_calls_render_as_the_sdk_reads_them() -> None:
    """A reasoning model's answer (pieces as the answer stage reads them) through the stream
    renderer into the SDK's own stream state, and the whole response through its model."""
    pieces = [AnswerPiece("reasoning", "Let me "), AnswerPiece("reasoning", "think."),
              AnswerPiece("call", "", 0, "call_a", "get_weather"), AnswerPiece("call", '{"city": ', 0),
              AnswerPiece("call", '"Oslo"}', 0), AnswerPiece("call", '{"city": "Rome"}', 1, "call_b", "get_weather")]
    calls = ({"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}})
    result = RequestResult("req-1", "", "tool_calls", 7, 9, None, 1, 0.0, 0.0, 1.0, reasoning="Let me think.",
                           content=None, tool_calls=calls, whole_calls=2)
    echo = {"tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": True}
    events = ResponseEvents(ResponseShape(ResponsesCall(None, "m", True, True, echo, []), "req-1", "m"))  # type: ignore[arg-type]
    stream = [*events.start(), *events.pieces(tuple(pieces[:3])), *events.pieces(tuple(pieces[3:]))]
    last, whole = events.end(result)
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[WEATHER], text_format=openai.omit)
    for name, data in [*stream, *last]:
        assert data["type"] == name
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))
    final = state._completed_response
    for answer in (final, Response.model_validate(whole)):
        assert [item.type for item in answer.output] == ["reasoning", "function_call", "function_call"]
        assert answer.output[0].content[0].text == "Let me think."
        assert [json.loads(item.arguments) for item in answer.output[1:]] == [{"city": "Oslo"}, {"city": "Rome"}]
        assert [item.call_id for item in answer.output[1:]] == ["call_a", "call_b"]
    kinds = [name for name, _ in stream]
    assert kinds.count("response.reasoning_text.delta") == 2 and kinds.count("response.output_item.added") == 3


# -- fields and errors, in OpenAI's shape ------------------------------------------------------------
async def test_fields_it_does_not_act_on_are_named(http: httpx.AsyncClient) -> None:
    body = {"model": "simulated", "input": ASK, "max_output_tokens": 4, "top_logprobs": 2, "stop": ["x"]}
    answer = await http.post("responses", json=body)
    assert answer.status_code == 200 and answer.headers["x-ignored-fields"] == "stop, top_logprobs"


BAD_BODIES = [  # (body, the param its error names, what its message says)
    ({"model": "simulated"}, "input", "'input' is required"),
    ({"input": 3}, "input", "'input' must be a string or a list"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input",
     "only text parts"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "'item_reference' item"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input", "'call_id', 'name' and 'arguments'"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input", "'call_id' of the call"),
    ({"input": ASK, "instructions": 3}, "instructions", "'instructions' must be a string"),
    ({"input": ASK, "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"input": ASK, "tools": [{"type": "function", "name": "bad name!"}]}, "tools", "tools[0]"),
    ({"input": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice",
     "not among the request's tools"),
    ({"input": ASK, "tool_choice": "required"}, "tool_choice", "no 'tools'"),
    ({"input": ASK, "tool_choice": {"type": "allowed_tools"}}, "tool_choice", "'tool_choice' must be"),
    ({"input": ASK, "text": {"format": {"type": "xml"}}}, "text", "'text.format' must be"),
    ({"input": ASK, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "needs a 'schema'"),
    ({"input": ASK, "max_output_tokens": -1}, "max_output_tokens", "'max_output_tokens' must be"),
    ({"input": ASK, "max_output_tokens": 10**6}, "max_output_tokens", "max_output_tokens"),
    ({"input": ASK, "temperature": 3}, "temperature", "'temperature'"),
    ({"input": ASK, "store": "yes"}, "store", "'store' must be"),
    ({"input": ASK, "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": ASK, "background": True}, "background", "'background' is not supported"),
    ({"input": ASK, "previous_response_id": 7}, "previous_response_id", "a response's id"),
    ({"input": ASK, "model": "gpt-5"}, "model", "not served here"),
    ([1, 2], "body", "JSON object"),
]


async def test_bad_bodies_are_4xx_in_openai_shape(http: httpx.AsyncClient, jp_serverapp: Any) -> None:
    """Each refused with OpenAI's error naming the field (one server for them all: a server
    per body would double this file's time)."""
    for body, param, message in BAD_BODIES:
        response = await http.post("responses", json=body)
        assert response.status_code in (400, 404), (body, response.text)
        error = response.json()["error"]
        assert error["type"] in ("invalid_request_error", "not_found_error"), (body, error)
        assert message in error["message"] and error["param"] == param, (body, error)
    service = service_of(jp_serverapp)
    assert service.metrics()["requests"]["ok"] == 0 and service.queue_depth == 0 and service.num_running == 0


async def test_errors_through_the_sdk(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_nothing")
    stranger = openai.AsyncOpenAI(base_url=str(http.base_url).rstrip("/"), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await stranger.responses.create(model="simulated", input=ASK)
    await stranger.close()
    assert (await http.put("responses")).status_code == 405


async def test_a_late_error_is_an_error_event_then_failed(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    body = {"input": f"{POISON} me", "max_output_tokens": 3, "stream": True}
    async with http.stream("POST", "responses", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    events, _ = parse_sse(text)
    assert [e.event for e in events][-2:] == ["error", "response.failed"]
    assert json.loads(events[-1].data)["response"]["error"]["code"] == "server_error"
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(model="simulated", input=f"{POISON} me")
