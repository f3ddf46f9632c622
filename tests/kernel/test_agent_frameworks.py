"""An agent framework, unmodified, against the real server on both engines: pydantic-ai's
``Agent`` with a tool and a typed output, run to its final result. On a random-weight model
the choice between the tool and the output is the grammar's (pydantic-ai sends
``tool_choice="required"`` when the output is a model: its output is a tool too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx2
import pytest
from openai_fixtures import engine_options
from pydantic import BaseModel, Field
from server_helpers import TOKEN, service_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["simulated", "hf"])
def infer_options(request: pytest.FixtureRequest, tiny_model_dir: Path) -> dict[str, Any]:
    return engine_options(request.param, tiny_model_dir)


class Forecast(BaseModel):
    degrees: int = Field(ge=0, le=40)
    sunny: bool


async def test_pydantic_ai_agent_runs_to_a_typed_result(base_url: str, jp_serverapp: Any) -> None:
    from pydantic_ai import Agent, RunContext, ToolDefinition, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        sent.append(json.loads(request.content))

    http = httpx2.AsyncClient(event_hooks={"request": [record]}, timeout=60)
    model = OpenAIChatModel("default", provider=OpenAIProvider(base_url=base_url, api_key=TOKEN, http_client=http))
    # One call a turn (a random model would repeat calls until max_tokens). The tools' schemas go
    # into the prompt and the tiny model reads 512 tokens: small schemas, no instructions, and no
    # max_tokens (the server gives what room is left; the grammar ends every answer). On the tiny
    # model the first prompt is ~450 tokens, leaving ~60 for a call.
    settings = ModelSettings(temperature=0, parallel_tool_calls=False)
    agent = Agent(model, output_type=ToolOutput(Forecast, name="answer", description="The forecast."),
                  model_settings=settings, retries=0)
    calls: list[str] = []

    async def once(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
        return None if calls else tool  # after one call only the output tool is left: the run ends

    @agent.tool_plain(prepare=once)
    def get_weather(city: Annotated[str, Field(max_length=8)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"18 C, sun in {city}"

    try:
        result = await agent.run("Weather in Paris?")
    finally:
        await http.aclose()
    assert isinstance(result.output, Forecast) and 0 <= result.output.degrees <= 40
    ok = service_of(jp_serverapp).metrics()["requests"]["ok"]
    assert ok == len(sent) == len(calls) + 1 >= 1  # each tool call took one more turn, then the answer
    assert all(body["tool_choice"] == "required" for body in sent)  # the output is a tool: a call is due
    assert [len(body["tools"]) for body in sent] == [2] * len(calls) + [1 if calls else 2]
    if calls:  # the call and its result went back as an assistant message and a tool message
        roles = [m["role"] for m in sent[-1]["messages"]]
        assert roles[-2:] == ["assistant", "tool"] and sent[-1]["messages"][-2]["tool_calls"]
