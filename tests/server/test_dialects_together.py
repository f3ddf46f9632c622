"""Every dialect is a translator onto one queue: chat completions, Responses, Anthropic
Messages, Ollama's chat, embeddings and infill sent at once run in one batch of the engine,
and each answers in its own shape."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from server_helpers import AUTH, server_config

pytestmark = pytest.mark.timeout(120)
ASK = [{"role": "user", "content": "What is a KV cache?"}]


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    # Slow enough steps that requests sent together are still running when the last arrives;
    # a window batch takes every request that lands in its first 300 ms.
    return server_config(simulated_token_delay_ms=[5.0, 5.0], mode="window", batch_window_ms=300.0)


async def test_five_dialects_sent_at_once_run_in_one_batch(jp_fetch: Any, jp_http_port: int,
                                                          jp_base_url: str) -> None:
    import httpx

    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/"
    calls = {
        "v1/chat/completions": {"model": "simulated", "messages": ASK, "max_tokens": 8},
        "v1/responses": {"model": "simulated", "input": ASK, "max_output_tokens": 8},
        "v1/messages": {"model": "simulated", "messages": ASK, "max_tokens": 8},
        "api/chat": {"model": "simulated", "messages": ASK, "stream": False, "options": {"num_predict": 8}},
        "v1/embeddings": {"model": "simulated", "input": "What is a KV cache?"},
    }
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as http:
        answers = await asyncio.gather(*(http.post(path, json=body) for path, body in calls.items()))
        for path, answer in zip(calls, answers, strict=True):
            assert answer.status_code == 200, (path, answer.text)
        ids = {path: a.headers["X-Request-Id"] for path, a in zip(calls, answers, strict=True)}
        batches = (await http.get("batches")).json()["batches"]
    together = [b for b in batches if set(ids.values()) <= set(b["members"])]
    assert together, (ids, [b["members"] for b in batches])
    shapes = dict(zip(calls, (a.json() for a in answers), strict=True))
    assert shapes["v1/chat/completions"]["object"] == "chat.completion"
    assert shapes["v1/responses"]["object"] == "response"
    assert shapes["v1/messages"]["type"] == "message"
    assert shapes["api/chat"]["done"] is True and shapes["api/chat"]["message"]["role"] == "assistant"
    assert shapes["v1/embeddings"]["object"] == "list"
