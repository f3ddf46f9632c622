"""Hostile constraints through the real server: each is answered correctly (the answer fits)
or refused with a 400 within the time limit; never a 5xx, and Jupyter's own API stays
responsive while they compile."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import jsonschema
import pytest
from server_helpers import AUTH, service_of

pytestmark = pytest.mark.timeout(240)
LIMIT_S = 5.0


def nested_unions(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 9}
    for _ in range(depth):
        schema = {"anyOf": [{"type": "object", "properties": {"v": schema}, "required": ["v"],
                             "additionalProperties": False}, {"type": "null"}]}
    return schema


def many_tools(n: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 5}},
        "required": ["x"], "additionalProperties": False}}} for i in range(n)]


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("nested unions, depth 60", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": nested_unions(60)}}}),
    ("an enum of 20,000 values", {"guided_json": {"enum": [f"value-{i}" for i in range(20_000)]}}),
    ("a backtracking regex", {"guided_regex": "(a+)+b"}),
    ("a schema pattern that backtracks", {"guided_json": {"type": "string", "pattern": "^(a|aa)+$",
                                                          "maxLength": 12}}),
    ("300 tools", {"tools": many_tools(300), "tool_choice": "required"}),
    ("a recursive $ref with no way out", {"guided_json": {"$defs": {"a": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/a"}}, "required": ["a"]}}, "$ref": "#/$defs/a"}}),
    ("a schema that is a bare string", {"guided_json": {"type": "string", "maxLength": 5}}),
    ("a schema that is true", {"guided_json": True}),
    ("an unknown format", {"guided_json": {"type": "string", "format": "no-such-format"}}),
    ("a grammar that does not parse", {"guided_grammar": "start: (("}),
]


@pytest.fixture
def infer_options() -> dict[str, Any]:
    return {"grammar_timeout_s": LIMIT_S, "max_new_tokens": 200, "simulated_token_delay_ms": [1.0, 1.0]}


@pytest.fixture
def http(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}", headers=AUTH, timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


def fits(body: dict[str, Any], answer: dict[str, Any]) -> None:
    """A 200 answer is what the constraint asked for."""
    choice = answer["choices"][0]
    if choice["finish_reason"] == "length":
        return  # cut short by max_tokens: no claim to a whole value
    if "tools" in body:
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"].startswith("tool_") and json.loads(call["arguments"])["x"] in range(6)
        return
    text = choice["message"]["content"]
    if "guided_regex" in body:
        assert text.endswith("b") and set(text) <= {"a", "b"}
    elif "guided_json" in body:
        schema = body["guided_json"]
        jsonschema.validate(json.loads(text), {} if schema is True else schema)
    elif "response_format" in body:
        jsonschema.validate(json.loads(text), body["response_format"]["json_schema"]["schema"])


@pytest.mark.parametrize(("name", "extra"), HOSTILE, ids=[n for n, _ in HOSTILE])
async def test_hostile_constraints_are_answered_or_refused_in_time(http: httpx.AsyncClient, name: str,
                                                                    extra: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "Go"}], "max_tokens": 150, **extra}
    started = time.monotonic()
    answer = await http.post("infer/v1/chat/completions", json=body)
    took = time.monotonic() - started
    assert answer.status_code in (200, 400), (name, answer.status_code, answer.text[:300])
    if name == "an enum of 20,000 values":  # 289 KB of schema that compiles in milliseconds: no byte cap refuses it
        assert answer.status_code == 200, answer.text[:300]
    assert took < LIMIT_S + 10, (name, took)
    if answer.status_code == 400:
        assert answer.json()["error"]["type"] == "invalid_request_error"
    else:
        fits(body, answer.json())


async def test_jupyter_answers_while_constraints_compile(http: httpx.AsyncClient, jp_serverapp: Any) -> None:
    """Compiles run on worker threads: Jupyter's own API answers well under a second meanwhile."""
    # Measured from ready on: the one full collection after the load runs before it (every
    # thread waits for it; in this test process it walks over a million objects: 1.1 s was
    # seen in CI when the first status call landed on it). It is the load's, not a compile's.
    await service_of(jp_serverapp).wait_ready()
    heavy = [{"messages": [{"role": "user", "content": "Go"}], "max_tokens": 4, "guided_json": {
        "enum": [f"v{j}-{i}" for i in range(20_000)]}} for j in range(3)]
    calls = [asyncio.ensure_future(http.post("infer/v1/chat/completions", json=b)) for b in heavy]
    worst = 0.0
    while not all(c.done() for c in calls):
        started = time.monotonic()
        status = await http.get("api/status")
        worst = max(worst, time.monotonic() - started)
        assert status.status_code == 200
        await asyncio.sleep(0.05)
    assert all(c.result().status_code in (200, 400) for c in calls)
    assert worst < 1.0, worst


@pytest.mark.parametrize("stream", [False, True])
async def test_a_grammar_with_no_way_out_is_refused_before_the_stream_starts(http: httpx.AsyncClient,
                                                                             stream: bool) -> None:
    """A forced start with nothing after it: a 400 before any header, streamed or not (it was a
    200 and then an error chunk: agent frameworks take those differently), as vLLM refuses."""
    body = {"prompt": "Go", "max_tokens": 10, "stream": stream, "guided_grammar": 'start: "a" b\nb: b "c"'}
    answer = await http.post("infer/v1/completions", json=body)
    assert answer.status_code == 400 and answer.headers["Content-Type"].startswith("application/json"), answer.text
    assert "allows no answer" in answer.json()["error"]["message"]
