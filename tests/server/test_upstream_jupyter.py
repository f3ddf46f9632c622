"""engine = "openai" with another jupyter_infer as the upstream: a real ``jupyter server``
subprocess (simulated engine) behind this process's server. Cancellation reaches the
upstream, a killed upstream ends streams with an error (never a hang), and its return is
noticed."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import AUTH, eventually, parse_sse

from jupyter_infer.kernel.launcher import LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def upstream_server() -> Iterator[LocalServer]:
    with LocalServer(engine="simulated", simulated_token_delay_ms=[20.0, 20.0]) as server:
        yield server


@pytest.fixture
def infer_options(upstream_server: LocalServer) -> dict[str, Any]:
    return {
        "engine": "openai",
        "upstream_url": f"{upstream_server.url}infer/v1",
        "upstream_api_key": upstream_server.token,  # the upstream's Jupyter token
        "upstream_retries": 1,
        "upstream_timeout_s": 10.0,
    }


@pytest.fixture
def front(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}", headers=AUTH, timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


def upstream_metrics(server: LocalServer) -> dict[str, Any]:
    return server.get("infer/metrics")


async def test_a_client_that_leaves_cancels_the_request_upstream(front: httpx.AsyncClient,
                                                                 upstream_server: LocalServer) -> None:
    await front.get("infer/v1/models")  # answers once the front has looked at the upstream
    status = (await front.get("infer/status")).json()
    assert status["engine"] == "openai" and status["model"] == "simulated"
    assert status["upstream"]["reachable"] is True
    async with front.stream("POST", "infer/generate_stream",
                            json={"prompt": "Explain the KV cache in depth", "max_tokens": 400}) as response:
        tokens = 0
        async for line in response.aiter_lines():
            tokens += line.startswith("event: token")
            if tokens == 3:
                break  # and leave: the connection closes
    await eventually(lambda: upstream_metrics(upstream_server)["requests"]["cancelled"] == 1, timeout=10)
    upstream = upstream_metrics(upstream_server)
    assert upstream["requests"]["running"] == 0 and upstream["requests"]["ok"] == 0
    ours = (await front.get("infer/metrics")).json()
    assert ours["requests"]["cancelled"] == 1


async def test_an_upstream_killed_mid_stream_is_an_error_event_and_its_return_is_noticed(
    front: httpx.AsyncClient, upstream_server: LocalServer,
) -> None:
    events_text = ""
    async with front.stream("POST", "infer/generate_stream",
                            json={"prompt": "Explain attention", "max_tokens": 400}) as response:
        async for chunk in response.aiter_text():
            events_text += chunk
            if events_text.count("event: token") == 3:
                upstream_server._proc.send_signal(signal.SIGKILL)  # no goodbye: the socket just dies
        # the loop ends because the front ends the stream, not because a timeout hit
    events, _ = parse_sse(events_text)
    assert [e.event for e in events][-1] == "error"
    error = json.loads(events[-1].data)
    assert error["code"] == "upstream_error" and "mid-way" in error["message"]

    refused = await front.post("infer/generate", json={"prompt": "hello", "max_tokens": 4})
    assert refused.status_code == 503 and refused.json()["code"] == "upstream_unavailable"
    assert "Check that it is running" in refused.json()["message"]
    down = (await front.get("infer/status")).json()
    assert down["upstream"]["reachable"] is False and down["state"] == "unreachable"

    await asyncio.to_thread(upstream_server.start)  # back, on the same port

    async def reachable() -> bool:
        return (await front.get("infer/status")).json()["upstream"]["reachable"] is True

    await eventually(reachable, timeout=30)
    again = await front.post("infer/generate", json={"prompt": "What is batching?", "max_tokens": 4})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 4


async def test_constraints_and_tools_pass_through_to_the_upstream(front: httpx.AsyncClient) -> None:
    """response_format, a native regex and tools go upstream as fields; the upstream's streamed
    tool calls come back as ours (whole and streamed)."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    answer = await front.post("infer/v1/chat/completions", json={
        "messages": ask, "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "flag", "schema": schema}}})
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.json()["choices"][0]["message"]["content"]) in ({"ok": True}, {"ok": False})
    native = await front.post("infer/generate", json={"prompt": "A code:", "regex": "[A-Z]{3}", "max_tokens": 8})
    assert native.status_code == 200 and len(native.json()["text"]) == 3 and native.json()["text"].isupper()
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}
    body = {"messages": ask, "max_tokens": 60, "tools": [tool], "tool_choice": "required"}
    whole = await front.post("infer/v1/chat/completions", json=body)
    message = whole.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather", whole.text
    assert "city" in json.loads(message["tool_calls"][0]["function"]["arguments"])
    assert whole.json()["choices"][0]["finish_reason"] == "tool_calls"
    async with front.stream("POST", "infer/v1/chat/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(line[6:]) async for line in response.aiter_lines()
                  if line.startswith("data: {")]
    deltas = [d for c in chunks for d in (c["choices"][0]["delta"].get("tool_calls") or [])]
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"].startswith("call_")
    assert json.loads("".join(d["function"]["arguments"] for d in deltas))["city"] is not None
