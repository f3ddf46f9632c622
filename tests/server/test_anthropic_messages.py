"""Anthropic's Messages API (``infer/v1/messages``, ``…/count_tokens``), driven by the official
``anthropic`` client over a real port: text and tool calls, whole and streamed (the SDK's own
stream parser reads our events and raises on a malformed one), tool results, stop sequences,
counting, errors in Anthropic's shape; and the same answer as the chat route for the same chat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message
from server_helpers import AUTH, POISON, TOKEN, service_of

from jupyter_infer.values.answer import AnswerPiece
from jupyter_infer.values.request import RequestResult
from jupyter_infer.wire.anthropic_messages import MessageEvents, message

pytestmark = pytest.mark.timeout(180)

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is a KV cache?"}]


@pytest.fixture
def server_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    """The base URL the SDK is given: it posts to ``<base_url>/v1/messages``."""
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer"


@pytest.fixture
def claude(server_url: str, jp_asyncio_loop: Any) -> Any:
    """Anthropic's client, with the Jupyter token as its API key."""
    api = anthropic.AsyncAnthropic(base_url=server_url, api_key=TOKEN, max_retries=0, timeout=60)
    yield api
    jp_asyncio_loop.run_until_complete(api.close())


@pytest.fixture
def raw(server_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=server_url + "/v1/", timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


async def stream_of(claude: anthropic.AsyncAnthropic, **kw: Any) -> tuple[str, Message]:
    """The streamed text (``text_stream``) and the SDK's final message."""
    async with claude.messages.stream(**kw) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    return text, final


def text_of(answer: Message) -> str:
    return "".join(block.text for block in answer.content if block.type == "text")


# -- text ------------------------------------------------------------------------------------------
async def test_text_whole_and_streamed(claude: anthropic.AsyncAnthropic) -> None:
    # The SDK's 2.x create() has no sampling arguments (they are deprecated for Claude models); the
    # wire still takes them, as older clients and proxies send them.
    kw = {"model": "simulated", "max_tokens": 12, "messages": ASK, "system": "Be brief.",
          "metadata": {"user_id": "someone"}, "extra_body": {"temperature": 0, "top_p": 1, "top_k": 0}}
    whole = await claude.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.model == "simulated" and [b.type for b in whole.content] == ["text"]
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 12
    text, final = await stream_of(claude, **kw)
    assert text == text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


async def test_the_wire_of_a_stream(raw: httpx.AsyncClient) -> None:
    """The event sequence as Anthropic documents it, each block's index in order."""
    body = {"max_tokens": 6, "messages": ASK, "stream": True}
    async with raw.stream("POST", "messages", json=body, headers={"x-api-key": TOKEN}) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(":")]
        if lines:
            name, data = lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: "))
            assert data["type"] == name
            events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["output_tokens"] == 0
    assert events[-2]["usage"]["output_tokens"] == 6 and events[-2]["delta"]["stop_reason"] == "max_tokens"


# -- tools -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", [None, {"type": "any"}, {"type": "tool", "name": "get_weather"}])
async def test_a_tool_call_whole_and_streamed(claude: anthropic.AsyncAnthropic, choice: Any) -> None:
    kw: dict[str, Any] = {"model": "simulated", "max_tokens": 60, "tools": [WEATHER],
                          "messages": [{"role": "user", "content": 'Call get_weather for "Paris" please.'}]}
    if choice is not None:
        kw["tool_choice"] = choice
    whole = await claude.messages.create(**kw)
    calls = [b for b in whole.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].input == {"city": "Paris"}
    assert whole.stop_reason == "tool_use" and calls[0].id.startswith("toolu_")
    _, final = await stream_of(claude, **kw)
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [("get_weather", {"city": "Paris"})]
    assert final.stop_reason == "tool_use"


async def test_tool_choice_none_answers_in_text(claude: anthropic.AsyncAnthropic) -> None:
    answer = await claude.messages.create(
        model="simulated", max_tokens=10, tools=[WEATHER], tool_choice={"type": "none"},
        messages=[{"role": "user", "content": 'Call get_weather for "Paris" please.'}])
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason != "tool_use"


CONVERSATION = [
    {"role": "user", "content": [{"type": "text", "text": 'What is the weather in "Paris"?'}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                  "content": [{"type": "text", "text": "Sunny, 21 C"}]},
                                 {"type": "text", "text": "Thanks. Say it in one line."}]},
]
# The same chat as the chat route takes it.
OPENAI_CONVERSATION = [
    {"role": "system", "content": "You answer about the weather."},
    {"role": "user", "content": 'What is the weather in "Paris"?'},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_01", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "toolu_01", "content": "Sunny, 21 C"},
    {"role": "user", "content": "Thanks. Say it in one line."},
]
OPENAI_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                   "parameters": WEATHER["input_schema"]}}


async def test_a_tool_result_turn(claude: anthropic.AsyncAnthropic) -> None:
    answer = await claude.messages.create(model="simulated", max_tokens=12, tools=[WEATHER],
                                          system="You answer about the weather.", messages=CONVERSATION)
    assert [b.type for b in answer.content] == ["text"] and text_of(answer)
    assert answer.stop_reason in ("end_turn", "max_tokens")


# -- the same chat through both dialects ---------------------------------------------------------------
@pytest.fixture
def infer_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The simulated engine (scripted: tests/server_helpers.py), or, parametrized ``"hf"``
    (``indirect=True``), the hf engine on the tiny locally built model."""
    if getattr(request, "param", None) == "hf":
        model: Path = request.getfixturevalue("tiny_model_dir")
        return {"engine": "hf", "model": str(model), "dtype": "float32", "num_threads": 1, "max_new_tokens": 64}
    return {"max_new_tokens": 64}


@pytest.mark.parametrize("infer_options", ["simulated", "hf"], indirect=True)
async def test_the_dialect_costs_nothing(claude: anthropic.AsyncAnthropic, server_url: str) -> None:
    """The same chat (system, a call, its result, tools) through chat completions and Messages
    at temperature 0: the same prompt tokens, the same answer, and count_tokens counts them."""
    gpt = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        served = (await gpt.models.list()).data[0].id
        chat = await gpt.chat.completions.create(model=served, messages=OPENAI_CONVERSATION, tools=[OPENAI_WEATHER],
                                                 max_tokens=10, temperature=0)
    finally:
        await gpt.close()
    answer = await claude.messages.create(model=served, max_tokens=10, extra_body={"temperature": 0}, tools=[WEATHER],
                                          system="You answer about the weather.", messages=CONVERSATION)
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    assert answer.usage.output_tokens == chat.usage.completion_tokens
    said = chat.choices[0].message
    if said.tool_calls:  # the tiny random model may call the tool: the same call
        assert [(b.name, b.input) for b in answer.content if b.type == "tool_use"] == [
            (c.function.name, json.loads(c.function.arguments)) for c in said.tool_calls]
    else:
        assert text_of(answer) == said.content
    counted = await claude.messages.count_tokens(model=served, tools=[WEATHER], system="You answer about the weather.",
                                                 messages=CONVERSATION)
    assert counted.input_tokens == chat.usage.prompt_tokens


async def test_fields_it_does_not_act_on_are_named(raw: httpx.AsyncClient) -> None:
    body = {"model": "simulated", "max_tokens": 4, "messages": ASK, "service_tier": "auto", "x" * 80: 1}
    answer = await raw.post("messages", json=body, headers=AUTH)
    assert answer.status_code == 200
    assert answer.headers["x-ignored-fields"].startswith("service_tier, 'xxxx")  # a long name cut short


async def test_count_tokens(claude: anthropic.AsyncAnthropic, raw: httpx.AsyncClient) -> None:
    short = await claude.messages.count_tokens(model="simulated", messages=ASK)
    longer = await claude.messages.count_tokens(model="simulated", messages=ASK, system="Be brief.", tools=[WEATHER])
    assert 0 < short.input_tokens < longer.input_tokens
    whole = await claude.messages.create(model="simulated", max_tokens=2, messages=ASK)
    assert whole.usage.input_tokens == short.input_tokens
    bad = await raw.post("messages/count_tokens", json={"messages": []}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


# -- stop sequences ----------------------------------------------------------------------------------
async def test_stop_sequences(claude: anthropic.AsyncAnthropic) -> None:
    kw = {"model": "simulated", "max_tokens": 24, "messages": ASK, "extra_body": {"temperature": 0}}
    text = text_of(await claude.messages.create(**kw))
    cut = text[len(text) // 2: len(text) // 2 + 3]
    assert len(cut) == 3, text
    kw["stop_sequences"] = ["never-here", cut]
    whole = await claude.messages.create(**kw)
    assert whole.stop_reason == "stop_sequence" and whole.stop_sequence == cut
    assert text_of(whole) == text[: text.index(cut)]
    streamed, final = await stream_of(claude, **kw)
    assert streamed == text_of(whole) and (final.stop_reason, final.stop_sequence) == ("stop_sequence", cut)


# -- structured output ----------------------------------------------------------------------------
async def test_output_config_format_constrains_the_text(claude: anthropic.AsyncAnthropic) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    answer = await claude.messages.create(model="simulated", max_tokens=30, messages=ASK,
                                          output_config={"format": {"type": "json_schema", "schema": schema}})
    assert json.loads(text_of(answer)) in ({"ok": True}, {"ok": False})


# -- thinking: the answer stage's reasoning as thinking blocks --------------------------------------
def test_thinking_text_and_calls_render_as_the_sdk_reads_them() -> None:
    """A reasoning model's answer (pieces as the answer stage reads them) through the stream
    renderer into the SDK's own accumulator, and the whole message through its model."""
    pieces = [AnswerPiece("reasoning", "Let me "), AnswerPiece("reasoning", "think."), AnswerPiece("content", "Sure."),
              AnswerPiece("call", "", 0, "call_a", "get_weather"), AnswerPiece("call", '{"city": ', 0),
              AnswerPiece("call", '"Oslo"}', 0), AnswerPiece("call", '{"city": "Rome"}', 1, "call_b", "get_weather")]
    calls = ({"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}})
    result = RequestResult("req-1", "", "tool_calls", 7, 9, None, 1, 0.0, 0.0, 1.0, reasoning="Let me think.",
                           content="Sure.", tool_calls=calls, whole_calls=2)
    events = MessageEvents("req-1", "m", 7)
    stream = [*events.start(), *events.pieces(tuple(pieces[:3])), *events.pieces(tuple(pieces[3:])), *events.end(result)]
    snapshot, bufs = None, {}
    for name, data in stream:
        assert data["type"] == name
        if name != "ping":
            snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=bufs)
    whole = Message.model_validate(message(result, "req-1", "m"))
    for answer in (snapshot, whole):
        assert [b.type for b in answer.content] == ["thinking", "text", "tool_use", "tool_use"]
        assert answer.content[0].thinking == "Let me think." and answer.content[1].text == "Sure."
        assert [b.input for b in answer.content[2:]] == [{"city": "Oslo"}, {"city": "Rome"}]
        assert answer.stop_reason == "tool_use" and answer.usage.output_tokens == 9
    assert [d["index"] for n, d in stream if n == "content_block_start"] == [0, 1, 2, 3]


async def test_thinking_is_accepted(claude: anthropic.AsyncAnthropic) -> None:
    answer = await claude.messages.create(model="simulated", max_tokens=4, messages=ASK,
                                          thinking={"type": "enabled", "budget_tokens": 1024})
    assert answer.content and answer.content[0].type == "text"  # this model writes no reasoning


# -- auth and errors, in Anthropic's shape ---------------------------------------------------------
async def test_a_bad_key_is_a_401_authentication_error(server_url: str, raw: httpx.AsyncClient) -> None:
    stranger = anthropic.AsyncAnthropic(base_url=server_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        await stranger.messages.create(model="simulated", max_tokens=2, messages=ASK)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        await stranger.messages.count_tokens(model="simulated", messages=ASK)
    await stranger.close()
    body = {"max_tokens": 2, "messages": ASK}
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        refused = await raw.post("messages", json=body, headers=headers)
        assert refused.status_code == 401, headers
        assert refused.json()["error"]["type"] == "authentication_error" and "x-api-key" in refused.json()["error"]["message"]
    for headers in ({"x-api-key": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}):  # both ways of sending the key
        assert (await raw.post("messages", json=body, headers=headers)).status_code == 200, headers


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": ASK}, "'max_tokens' is required"),
        ({"max_tokens": 0, "messages": ASK}, "'max_tokens' is required"),
        ({"max_tokens": 4, "messages": []}, "non-empty list"),
        ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "top-level 'system'"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": 3}]}, "string or a list of content blocks"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image' blocks"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                                      "input": {}}]}]}, "'tool_use' blocks"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "'text'"),
        ({"max_tokens": 4, "messages": ASK, "system": [{"type": "image"}]}, "only text blocks"),
        ({"max_tokens": 4, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "only custom tools"),
        ({"max_tokens": 4, "messages": ASK, "tools": [{"name": "bad name!", "input_schema": {}}]}, "tools[0]"),
        ({"max_tokens": 4, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "g"}},
         "not among the request's tools"),
        ({"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "any"}}, "no 'tools'"),
        ({"max_tokens": 4, "messages": ASK, "tool_choice": "auto"}, "'tool_choice' must be"),
        ({"max_tokens": 4, "messages": ASK, "stop_sequences": "x"}, "'stop_sequences' must be a list"),
        ({"max_tokens": 4, "messages": ASK, "stop_sequences": [f"s{i}" for i in range(65)]},
         "'stop_sequences' takes at most 64"),
        ({"max_tokens": 4, "messages": ASK, "temperature": 3}, "'temperature'"),
        ({"max_tokens": 4, "messages": ASK, "thinking": "on"}, "'thinking' must be"),
        ({"max_tokens": 4, "messages": ASK, "output_config": {"format": {"type": "xml"}}}, "output_config.format"),
        ([1, 2], "JSON object"),
    ],
)
async def test_bad_bodies_are_400s_in_anthropic_shape(
    raw: httpx.AsyncClient, jp_serverapp: Any, body: Any, message: str
) -> None:
    response = await raw.post("messages", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
    assert answer["error"]["type"] == "invalid_request_error" and message in answer["error"]["message"], answer
    service = service_of(jp_serverapp)
    assert service.metrics()["requests"]["ok"] == 0 and service.queue_depth == 0 and service.num_running == 0


async def test_errors_through_the_sdk(claude: anthropic.AsyncAnthropic, raw: httpx.AsyncClient) -> None:
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        await claude.messages.create(model="simulated", max_tokens=0, messages=ASK)
    with pytest.raises(anthropic.NotFoundError) as err:
        await claude.messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error" and "not served here" in err.value.body["error"]["message"]
    for method, path, status in [("GET", "messages", 405), ("DELETE", "messages/count_tokens", 405)]:
        response = await raw.request(method, path, headers=AUTH)
        assert response.status_code == status and response.json()["error"]["type"] == "invalid_request_error"


async def test_a_late_error_is_an_error_event(claude: anthropic.AsyncAnthropic, raw: httpx.AsyncClient) -> None:
    body = {"max_tokens": 3, "messages": [{"role": "user", "content": f"{POISON} me"}], "stream": True}
    async with raw.stream("POST", "messages", json=body, headers=AUTH) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    last = [b for b in text.split("\n\n") if b and not b.startswith(":")][-1].splitlines()
    assert last[0] == "event: error"
    assert json.loads(last[1].removeprefix("data: "))["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError):
        await stream_of(claude, model="simulated", **{k: v for k, v in body.items() if k != "stream"})


async def test_litellm_s_anthropic_provider(claude: anthropic.AsyncAnthropic, server_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's ``anthropic/`` provider (what Jupyter AI 3 and many agent frameworks route
    through), the token as its ``api_key`` (sent as ``x-api-key``): text whole and streamed, and
    a tool call. LiteLLM makes blocking calls of its own: it runs on a thread, the server here."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list: offline
    import asyncio

    import litellm

    litellm.telemetry = False
    kw = {"model": "anthropic/simulated", "messages": ASK, "api_base": server_url, "api_key": TOKEN,
          "max_tokens": 12, "temperature": 0, "timeout": 60}
    answer = await asyncio.to_thread(litellm.completion, **kw)
    ours = await claude.messages.create(model="simulated", max_tokens=12, messages=ASK, extra_body={"temperature": 0})
    assert answer.choices[0].message.content == text_of(ours)
    assert answer.usage.completion_tokens == ours.usage.output_tokens

    def stream() -> str:
        return "".join(c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **kw))

    assert await asyncio.to_thread(stream) == text_of(ours)
    openai_tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                    "parameters": WEATHER["input_schema"]}}
    called = await asyncio.to_thread(litellm.completion, **{
        **kw, "messages": [{"role": "user", "content": 'Call get_weather for "Paris" please.'}],
        "tools": [openai_tool], "max_tokens": 60})
    calls = called.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
