"""The notebook side of tool calls: ``Client.chat(tools=...)`` with Python functions, and the
agent loop (call → result → answer), embedded and over HTTP against a real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from client_helpers import fast_service
from pydantic import Field

from jupyter_infer import Client
from jupyter_infer.kernel.client.function_tools import function_tool
from jupyter_infer.kernel.launcher import LocalServer
from jupyter_infer.kernel.tool_agent import run_tool_agent

pytestmark = pytest.mark.timeout(120)


def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
    """The weather in a city.

    (Only the first paragraph describes the tool.)"""
    return f"18 {unit}, sunny in {city[:10]}"


async def broken_clock(zone: int) -> str:
    """The time in a zone."""
    raise RuntimeError("the clock is broken")


def test_a_function_becomes_a_tool_spec() -> None:
    spec = function_tool(get_weather)["function"]
    assert spec["name"] == "get_weather" and spec["description"] == "The weather in a city."
    params = spec["parameters"]
    assert params["required"] == ["city"] and params["additionalProperties"] is False
    assert params["properties"]["unit"] == {"enum": ["c", "f"], "type": "string", "default": "c"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with LocalServer(engine="simulated", simulated_token_delay_ms=[1.0, 2.0]) as running:
        yield running


@pytest.fixture(params=["embedded", "http"])
def client(request: pytest.FixtureRequest, server: LocalServer) -> Iterator[Client]:
    made = Client(embedded=fast_service()) if request.param == "embedded" else Client(server.url.rstrip("/"),
                                                                                       server.token)
    with made:
        yield made


def test_chat_returns_the_calls(client: Client) -> None:
    completion = client.chat([{"role": "user", "content": "Weather in Paris?"}], tools=[get_weather],
                             tool_choice="required", max_tokens=100)
    [call] = completion.tool_calls
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]).keys() <= {"city", "unit"}
    assert completion.text == ""
    plain = client.chat([{"role": "user", "content": "Hello"}], max_tokens=6)
    assert plain.tool_calls is None and plain.text


def test_the_agent_calls_runs_and_answers(client: Client) -> None:
    run = asyncio.run(run_tool_agent(client, "What is the weather in Paris?", [get_weather, broken_clock]))
    assert run.steps and run.steps[0].name in ("get_weather", "broken_clock")
    for step in run.steps:
        assert step.result.startswith("18 ") if step.name == "get_weather" else step.error
    assert run.answer  # the run ends in text
    roles = [m["role"] for m in run.messages]
    assert roles[:3] == ["user", "assistant", "tool"]
    assert "get_weather" in run.to_html() or "broken_clock" in run.to_html()


def forecast(city: Annotated[str, Field(max_length=8)], days: Annotated[int, Field(ge=1, le=3)] = 1) -> str:
    """A forecast: bounded arguments, so a random-weight model's call ends."""
    return f"{days} day(s) of sun in {city}"


def test_the_agent_on_a_real_model(tiny_model_dir: Path) -> None:
    spec = function_tool(forecast)["function"]["parameters"]["properties"]
    assert spec["city"]["maxLength"] == 8 and spec["days"]["maximum"] == 3
    with LocalServer(engine="hf", model=str(tiny_model_dir), dtype="float32", num_threads=1) as running, \
            Client(running.url.rstrip("/"), running.token) as client:
        run = asyncio.run(run_tool_agent(client, "Weather?", [forecast], max_tokens=60))
    assert run.steps and all(s.name == "forecast" and "sun in" in s.result for s in run.steps)
    assert isinstance(run.answer, str) and len(run.completions) >= 2


def test_calls_an_unconstrained_upstream_might_make_become_error_results() -> None:
    """Found in review: behind an upstream that does not constrain its calls, a call to an
    unknown tool or with arguments that are not JSON raised out of the agent."""
    from jupyter_infer.kernel.tool_agent import _arguments, _run

    assert _arguments({"function": {"arguments": "{not json"}}) is None
    assert _arguments({"function": {"arguments": "[1]"}}) is None
    assert asyncio.run(_run(None, {})) == ("No such tool.", True)
    assert asyncio.run(_run(get_weather, None))[1] is True
    assert asyncio.run(_run(get_weather, {"city": "Paris"})) == ("18 c, sunny in Paris", False)
