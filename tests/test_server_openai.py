"""The OpenAI-compatible routes, driven by the official ``openai`` client over a real port."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from server_helpers import AUTH, TOKEN

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def base_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1"


@pytest.fixture
def client(base_url: str, jp_asyncio_loop: Any) -> Any:
    """The official client, with the Jupyter token as its API key."""
    api = openai.AsyncOpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=30)
    yield api
    jp_asyncio_loop.run_until_complete(api.close())


async def test_models_lists_the_served_model(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["simulated"]
    assert models.data[0].owned_by == "jupyter_infer"


async def test_completion(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(
        model="simulated", prompt="Explain attention", max_tokens=8, temperature=0
    )
    assert completion.object == "text_completion" and completion.model == "simulated"
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason == "length" and choice.index == 0
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8


async def test_completion_defaults_follow_openai(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(model="default", prompt="Explain attention")
    assert completion.usage.completion_tokens == 16  # OpenAI's default max_tokens


async def test_streamed_completion_matches_the_whole_one(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="simulated", prompt="KV cache", max_tokens=20, temperature=0)
    stream = await client.completions.create(
        model="simulated", prompt="KV cache", max_tokens=20, temperature=0, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.id == chunks[0].id for c in chunks)


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    chat = await client.chat.completions.create(
        model="simulated",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is batching?"}],
        max_tokens=10, temperature=0, seed=3,
    )
    assert chat.object == "chat.completion"
    message = chat.choices[0].message
    assert message.role == "assistant" and message.content
    assert chat.usage.completion_tokens == 10


async def test_streamed_chat_with_usage(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is a KV cache?"}]}]
    whole = await client.chat.completions.create(model="simulated", messages=messages, temperature=0, max_tokens=12)
    stream = await client.chat.completions.create(
        model="simulated", messages=messages, temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_the_wire_ends_with_done(base_url: str) -> None:
    async with httpx.AsyncClient(headers=AUTH) as http:
        body = {"model": "simulated", "prompt": "hi", "max_tokens": 3, "stream": True}
        async with http.stream("POST", base_url + "/completions", json=body) as response:
            text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in text.split("\n\n") if b and not b.startswith(":")]
    assert blocks[-1] == "data: [DONE]"
    assert all(b.startswith("data: {") for b in blocks[:-1])


@pytest.mark.parametrize(
    ("route", "body", "param", "message"),
    [
        ("completions", {"prompt": "hi", "n": 2}, "n", "one choice"),
        ("completions", {"prompt": "hi", "logprobs": 2}, "logprobs", "log probabilities"),
        ("completions", {"prompt": "hi", "echo": True}, "echo", "echo"),
        ("completions", {"prompt": ["a", "b"]}, "prompt", "exactly one string"),
        ("completions", {"prompt": "hi", "model": "gpt-4o"}, "model", "not served here"),
        ("completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "positive integer"),
        ("completions", {"prompt": "hi", "temperature": 3}, "temperature", "between"),
        ("completions", {"prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty", "default"),
        ("completions", {"prompt": "hi", "wibble": 1}, "wibble", "Unsupported parameter"),
        ("chat/completions", {"messages": []}, "messages", "non-empty list"),
        ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages", "role"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tool calling"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, "response_format", "text"),
        ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages", "text parts"),
    ],
)
async def test_bad_requests_get_openai_shaped_400s(
    base_url: str, route: str, body: dict[str, Any], param: str, message: str
) -> None:
    async with httpx.AsyncClient(headers=AUTH) as http:
        response = await http.post(f"{base_url}/{route}", json={"model": "simulated", **body})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["param"] == param
        assert message in error["message"]
        # The server still answers.
        ok = await http.post(f"{base_url}/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200


async def test_the_client_raises_on_unknown_models_and_bad_keys(client: openai.AsyncOpenAI, base_url: str) -> None:
    with pytest.raises(openai.BadRequestError, match="not served here"):
        await client.completions.create(model="gpt-4o", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="one choice"):
        await client.chat.completions.create(model="simulated", messages=[{"role": "user", "content": "x"}], n=2)
    stranger = openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        await stranger.models.list()
    await stranger.close()


async def test_neutral_values_are_accepted_as_floats_too(client: openai.AsyncOpenAI) -> None:
    # Clients send their defaults explicitly, often as floats: 0.0 is the neutral 0.
    completion = await client.completions.create(
        model="default", prompt="Explain attention", max_tokens=3,
        frequency_penalty=0.0, presence_penalty=0, n=1,
    )
    assert completion.usage.completion_tokens == 3
