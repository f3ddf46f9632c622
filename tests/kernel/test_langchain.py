"""LangChain's OpenAI wrappers, unmodified, against the real server on both engines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from openai_fixtures import engine_options
from pydantic import BaseModel, Field
from server_helpers import TOKEN, service_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["simulated", "hf"])
def infer_options(request: pytest.FixtureRequest, tiny_model_dir: Path) -> dict[str, Any]:
    return engine_options(request.param, tiny_model_dir)


PROMPTS = ["What is attention?", "Explain the KV cache", "Why batch requests?", "What is a token?"]


async def test_openai_batch_sends_the_prompts_in_one_call(base_url: str, jp_serverapp: Any) -> None:
    from langchain_openai import OpenAI

    llm = OpenAI(base_url=base_url, api_key=TOKEN, model="default", max_tokens=6, temperature=0,
                 max_retries=0, extra_body={"top_k": 5})
    # LangChain's sync API in a thread: the server runs on this test's event loop.
    answers = await asyncio.to_thread(llm.batch, PROMPTS)
    alone = await asyncio.to_thread(llm.invoke, PROMPTS[1])
    assert len(answers) == 4 and all(isinstance(a, str) for a in answers)
    assert answers[1] == alone  # greedy: each choice is its prompt's own answer
    records = service_of(jp_serverapp).batches(limit=50)["requests"]
    assert len(records) == 5 and len({r["batch_id"] for r in records[:4]}) == 1  # one call, one batch


async def test_chat_openai_batch(base_url: str, jp_serverapp: Any) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=base_url, api_key=TOKEN, model="default", max_tokens=6, temperature=0,
                      max_retries=0, logprobs=True, top_logprobs=2)
    replies = await asyncio.to_thread(chat.batch, PROMPTS)
    assert len(replies) == 4 and all(r.content for r in replies)
    assert all(len(r.response_metadata["logprobs"]["content"]) == r.usage_metadata["output_tokens"] for r in replies)
    streamed = await asyncio.to_thread(lambda: "".join(c.content for c in chat.stream(PROMPTS[0])))
    assert streamed == replies[0].content
    assert service_of(jp_serverapp).metrics()["requests"]["ok"] == 5


# -- structured output and tools through LangChain (constrained: valid on a random-weight model) --
class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=12)
    degrees: int = Field(ge=-40, le=50)
    sky: Literal["sun", "rain", "snow"]


def get_weather(city: Annotated[str, Field(max_length=10)]) -> str:
    """The weather in a city.

    Args:
        city: the city's name
    """
    return f"18 C and sunny in {city}"


def chat_model(base_url: str, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url, api_key=TOKEN, model="default", temperature=0, max_retries=0,
                      max_tokens=120, **kwargs)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_with_structured_output_returns_the_model(base_url: str, jp_serverapp: Any, method: str) -> None:
    """The default method (``json_schema``: response_format) and ``function_calling`` (a named tool)."""
    chat = chat_model(base_url)
    # strict: additionalProperties false, else the grammar lets a random model add keys until max_tokens.
    structured = chat.with_structured_output(Weather) if method == "json_schema" else \
        chat.with_structured_output(Weather, method=method, strict=True)
    weather = await asyncio.to_thread(structured.invoke, "What is the weather in Paris?")
    assert isinstance(weather, Weather) and -40 <= weather.degrees <= 50
    assert service_of(jp_serverapp).metrics()["requests"]["ok"] == 1


@pytest.mark.parametrize(("tool", "tool_choice"), [(get_weather, "required"), (Weather, "Weather")])
async def test_bind_tools_and_a_tool_message_round_trip(
    base_url: str, jp_serverapp: Any, tool: Any, tool_choice: str,
) -> None:
    """invoke -> an AIMessage with tool_calls -> the ToolMessage appended -> a text answer."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    chat = chat_model(base_url)
    # strict: no extra keys; one call: a random model would otherwise repeat calls until max_tokens.
    with_tools = chat.bind_tools([tool], tool_choice=tool_choice, strict=True, parallel_tool_calls=False)
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = await asyncio.to_thread(with_tools.invoke, messages)
    assert isinstance(first, AIMessage) and first.tool_calls, first
    call = first.tool_calls[0]
    name = tool.__name__
    assert call["name"] == name and call["id"]
    result = get_weather(**call["args"]) if tool is get_weather else str(Weather(**call["args"]))
    messages += [first, ToolMessage(result, tool_call_id=call["id"])]
    # The same tools, now with tool_choice="none": the prompt renders the call and its result.
    second = await asyncio.to_thread(chat.bind_tools([tool], tool_choice="none").bind(max_tokens=8).invoke,
                                     messages)
    assert isinstance(second, AIMessage) and not second.tool_calls
    assert isinstance(second.content, str) and second.content
    # The call and its result are in the prompt: longer than the question alone plus the call.
    alone = await asyncio.to_thread(chat.bind(max_tokens=1).invoke, messages[:1])
    assert second.usage_metadata["input_tokens"] > \
        alone.usage_metadata["input_tokens"] + first.usage_metadata["output_tokens"]
    assert service_of(jp_serverapp).metrics()["requests"]["ok"] == 3
