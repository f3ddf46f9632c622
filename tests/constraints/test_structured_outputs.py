"""Structured outputs and tool calls through the real server, driven by the official ``openai``
client, on both engines (simulated, and hf on a tiny random-weight model: what it writes is
noise, so every valid answer here is the grammar's doing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from server_helpers import service_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["simulated", "hf"])
def infer_options(request: pytest.FixtureRequest, tiny_model_dir: Path) -> dict[str, Any]:
    if request.param == "hf":
        return {"engine": "hf", "model": str(tiny_model_dir), "dtype": "float32", "num_threads": 1,
                "max_new_tokens": 160}
    return {"max_new_tokens": 160, "simulated_token_delay_ms": [1.0, 2.0]}


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, as a strict schema has

    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=99)
    kind: Literal["town", "city"]
    tags: list[Literal["sea", "hill"]] = Field(max_length=2)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                                                                  "maximum": 12}},
                                       "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


async def test_parse_with_a_pydantic_model(client: openai.AsyncOpenAI) -> None:
    """The SDK's ``parse``: the answer validates as the model, bounds included."""
    completion = await client.chat.completions.parse(model="default", messages=ASK, response_format=City,
                                                     temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    city = choice.message.parsed
    assert isinstance(city, City) and 0 <= city.population <= 99


async def test_parse_streamed(client: openai.AsyncOpenAI) -> None:
    async with client.chat.completions.stream(model="default", messages=ASK, response_format=City,
                                              temperature=1.0, seed=3) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, City)


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_object"}},
    {"extra_body": {"guided_json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                   "minItems": 1, "maxItems": 3}}},
    {"extra_body": {"structured_outputs": {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                     "required": ["ok"]}}}},
])
async def test_json_answers_parse(client: openai.AsyncOpenAI, extra: dict[str, Any]) -> None:
    completion = await client.chat.completions.create(model="default", messages=ASK, temperature=0, **extra)
    assert completion.choices[0].finish_reason == "stop"
    value = json.loads(completion.choices[0].message.content)
    schema = (extra.get("extra_body") or {}).get("guided_json") or \
        ((extra.get("extra_body") or {}).get("structured_outputs") or {}).get("json") or {"type": "object"}
    jsonschema.validate(value, schema)


async def test_choice_and_regex_on_completions(client: openai.AsyncOpenAI) -> None:
    choice = await client.completions.create(model="default", prompt="Is it raining?", max_tokens=20,
                                             extra_body={"guided_choice": ["yes", "no", "maybe so"]})
    assert choice.choices[0].text in ("yes", "no", "maybe so")
    regex = await client.completions.create(model="default", prompt="A code:", max_tokens=20,
                                            extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}})
    import re

    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", regex.choices[0].text)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
async def test_tool_calls(client: openai.AsyncOpenAI, tool_choice: Any) -> None:
    completion = await client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER, CLOCK],
                                                      tool_choice=tool_choice, temperature=0)
    choice = completion.choices[0]
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    named = isinstance(tool_choice, dict)
    assert choice.finish_reason == ("stop" if named else "tool_calls")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in (("get_time",) if named else schemas)
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


async def test_streamed_tool_calls_accumulate_as_the_sdk_does(client: openai.AsyncOpenAI) -> None:
    async with client.chat.completions.stream(model="default", messages=ASK, tools=[WEATHER],
                                              tool_choice="required", temperature=0,
                                              parallel_tool_calls=False) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert final.choices[0].finish_reason == "tool_calls"


async def test_a_tool_round_trip_renders_back_into_the_prompt(client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER],
                                                 tool_choice="required", temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    second = await client.chat.completions.create(model="default", messages=messages, tools=[WEATHER],
                                                  tool_choice="none", max_tokens=8, temperature=0)
    assert second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)


async def test_auto_lets_the_model_answer_in_text(client: openai.AsyncOpenAI) -> None:
    """``auto`` on a model that does not open with ``<``: a plain text answer, no calls."""
    completion = await client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER],
                                                      max_tokens=8, temperature=0)
    choice = completion.choices[0]
    if choice.message.tool_calls:  # the model chose a call: it must be a valid one
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments),
                            WEATHER["function"]["parameters"])
        assert choice.finish_reason == "tool_calls"
    else:
        assert choice.message.content and not choice.message.content.startswith("<")


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "response_format", "cannot be enforced"),
    ({"guided_regex": "a("}, "guided_regex", "cannot be enforced"),
    ({"guided_grammar": 'root ::= "a'}, "guided_grammar", "not valid"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar", "not valid"),
    ({"structured_outputs": {"structural_tag": {"x": 1}}}, "structured_outputs", "Unsupported"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice",
     "'tool_choice' must be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": ["x"]}}, "tool_choice", "must be"),
    ({"guided_choice": []}, "guided_choice", "non-empty strings"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "One constraint"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "Two tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "letters, digits"),
    # Tools combine with a JSON schema or object for the text answer (calls or an object that
    # fits: tests/kernel/test_client_gaps.py), not with a regex.
    ({"tools": [WEATHER], "guided_regex": "a+"}, "guided_regex", "one or the other"),
])
async def test_bad_constraints_are_refused_before_anything_runs(
    http: httpx.AsyncClient, jp_serverapp: Any, body: dict[str, Any], param: str | None, message: str,
) -> None:
    response = await http.post("chat/completions", json={"messages": ASK, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]
    if param is not None:
        assert error["param"] == param
    assert service_of(jp_serverapp).metrics()["requests"]["ok"] == 0


async def test_max_tokens_inside_the_object_is_length(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="default", messages=ASK, max_tokens=3, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": City.model_json_schema()}})
    assert completion.choices[0].finish_reason == "length"


async def test_constrained_and_free_rows_share_a_batch(client: openai.AsyncOpenAI, jp_serverapp: Any) -> None:
    """Constrained rows batch with free ones, and each keeps its own rule."""
    import asyncio

    free = [client.completions.create(model="default", prompt=f"Say {i}", max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}) for i in range(3)]
    bound = [client.chat.completions.parse(model="default", messages=ASK, response_format=City, temperature=1.0,
                                           seed=i) for i in range(3)]
    results = await asyncio.gather(*free, *bound)
    assert all(r.usage.completion_tokens == 12 for r in results[:3])
    assert all(isinstance(r.choices[0].message.parsed, City) for r in results[3:])
    sizes = [b["size"] for b in service_of(jp_serverapp).batches()["batches"]]
    assert max(sizes) > 1


async def test_native_generate_takes_constraints(jp_fetch: Any) -> None:
    """infer/generate and infer/generate_stream: json_schema, regex, choice, grammar."""
    import re

    async def generate(**body: Any) -> dict[str, Any]:
        response = await jp_fetch("infer", "generate", method="POST",
                                  body=json.dumps({"prompt": "Answer:", "max_tokens": 150, **body}))
        return json.loads(response.body)

    answer = await generate(json_schema=City.model_json_schema())
    City.model_validate_json(answer["text"])
    assert (await generate(choice=["red", "green"]))["text"] in ("red", "green")
    assert re.fullmatch(r"\d{4}", (await generate(regex=r"\d{4}"))["text"])
    lark = (await generate(grammar='start: "x" ("y" | "z")'))["text"]
    gbnf = (await generate(grammar='root ::= "a" [0-9] [0-9]'))["text"]
    assert lark in ("xy", "xz") and re.fullmatch(r"a\d\d", gbnf)
    streamed = await jp_fetch("infer", "generate_stream", method="POST",
                              body=json.dumps({"prompt": "Answer:", "max_tokens": 60, "choice": ["on", "off"]}))
    assert b'"text": "on"' in streamed.body or b'"text": "off"' in streamed.body


def test_client_generate_with_a_schema_returns_the_parsed_object() -> None:
    from client_helpers import fast_service

    from jupyter_infer import Client

    with Client(embedded=fast_service()) as client:
        completion = client.generate("Describe a city", schema=City, max_tokens=120)
        assert isinstance(completion.parsed, City) and completion.finish_reason == "stop"
        loose = client.generate("Numbers", schema={"type": "array", "items": {"type": "integer", "maximum": 9,
                                                                               "minimum": 0}, "maxItems": 3})
        assert isinstance(loose.parsed, list)
        cut = client.generate("Describe a city", schema=City, max_tokens=2)
        assert cut.finish_reason == "length" and cut.parsed is None


def test_client_schemas_from_pydantic_are_closed() -> None:
    """A pydantic model that allows extra keys still gets an answer of its own fields only."""
    from client_helpers import fast_service

    from jupyter_infer import Client

    class Loose(BaseModel):
        title: str = Field(max_length=8)

    with Client(embedded=fast_service()) as client:
        completion = client.generate("A title", schema=Loose, max_tokens=60)
        assert list(json.loads(completion.text)) == ["title"]


@pytest.mark.parametrize("infer_options", [{"grammar_fast_forward": False, "simulated_token_delay_ms": [1.0, 2.0]},
                                           {"simulated_token_delay_ms": [1.0, 2.0]}])
async def test_fast_forward_spends_fewer_steps_and_metrics_tell_compiles(
    http: httpx.AsyncClient, jp_serverapp: Any, infer_options: dict[str, Any],
) -> None:
    """The same constrained answer, with and without fast-forward: equally valid; with it, a
    step yields several tokens. infer/metrics counts the compiles and their times."""
    schema = {"type": "object", "properties": {"alpha_key": {"enum": ["x", "y"]}, "beta_key": {"type": "boolean"}},
              "required": ["alpha_key", "beta_key"], "additionalProperties": False}
    answer = await http.post("chat/completions", json={
        "messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "k", "schema": schema}}})
    body = answer.json()
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
    service = service_of(jp_serverapp)
    metrics = service.metrics()["structured_outputs"]
    assert metrics["compiled"] == 1 and metrics["compile_ms_p99"] >= 0
    assert metrics["fast_forward"] is infer_options.get("grammar_fast_forward", True)
    [record] = service.batches()["batches"]
    assert record["tokens"] >= body["usage"]["completion_tokens"]  # EOS counts in the batch, not in usage
    per_step = record["tokens"] / record["steps"]
    assert per_step > 2 if metrics["fast_forward"] else per_step <= 1.0


async def test_tool_arguments_hold_only_the_declared_keys(client: openai.AsyncOpenAI) -> None:
    """A tool schema that leaves its object open (LangChain's default) gets calls with the
    tool's own arguments, not keys the model invents until max_tokens."""
    open_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}}}
    completion = await client.chat.completions.create(model="default", messages=ASK, tools=[open_tool],
                                                      tool_choice="required", parallel_tool_calls=False,
                                                      temperature=0, max_tokens=100)
    [call] = completion.choices[0].message.tool_calls
    assert json.loads(call.function.arguments).keys() == {"unit"}


async def test_records_say_which_rows_were_constrained_and_what_was_forced(http: httpx.AsyncClient,
                                                                            jp_serverapp: Any) -> None:
    await http.post("chat/completions", json={"messages": ASK, "max_tokens": 150,
                                              "response_format": {"type": "json_schema", "json_schema": {
                                                  "name": "c", "schema": City.model_json_schema()}}})
    await http.post("completions", json={"prompt": "free", "max_tokens": 4})
    batches = service_of(jp_serverapp).batches()
    bound, free = batches["requests"][-2:]
    assert bound["constraint"] == "json_schema" and 0 < bound["forced_tokens"] < bound["completion_tokens"] + 1
    assert free["constraint"] is None and free["forced_tokens"] == 0
    assert sum(b["forced_tokens"] for b in batches["batches"]) == bound["forced_tokens"]


async def test_live_events_carry_the_constraint_and_forced_tokens(jp_serverapp: Any, http: httpx.AsyncClient) -> None:
    service = service_of(jp_serverapp)
    subscription = service.subscribe()
    await http.post("completions", json={"prompt": "x", "max_tokens": 40, "guided_json": {"enum": ["alpha", "beta"]}})
    events = []
    while (event := await subscription.get(timeout=0.1)) is not None:
        events.append(event)
    subscription.close()
    queued = next(e for e in events if e["type"] == "queued")
    finished = next(e for e in events if e["type"] == "finished")
    assert queued["constraint"] == "json_schema" and finished["forced_tokens"] >= 1


async def test_streamed_tool_answers_keep_their_logprobs(http: httpx.AsyncClient) -> None:
    """Found in review: a streamed chat with tools computed each chunk's logprobs and sent none."""
    body = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60, "stream": True, "temperature": 0,
            "logprobs": True, "top_logprobs": 1}
    async with http.stream("POST", "chat/completions", json=body) as response:
        chunks = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: {")]
    records = [r for c in chunks for ch in c["choices"] if ch.get("logprobs") for r in ch["logprobs"]["content"]]
    whole = (await http.post("chat/completions", json={**body, "stream": False})).json()
    assert len(records) == len(whole["choices"][0]["logprobs"]["content"]) > 0
