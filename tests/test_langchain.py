"""LangChain's OpenAI wrappers, unmodified, against the real server on both engines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from server_helpers import TOKEN, service_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["simulated", "hf"])
def infer_options(request: pytest.FixtureRequest, tiny_model_dir: Path) -> dict[str, Any]:
    if request.param == "hf":
        return {"engine": "hf", "model": str(tiny_model_dir), "dtype": "float32", "num_threads": 1}
    return {}


@pytest.fixture
def base_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1"


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
