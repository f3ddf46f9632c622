"""The server with a real (tiny, locally built) Hugging Face model behind it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import TOKEN, parse_sse, server_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def jp_server_config(tiny_model_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(tiny_model_dir), max_new_tokens=64, mode="window",
                         batch_window_ms=200.0)


async def test_a_real_model_over_json_sse_and_openai(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any, tiny_model_dir: Path
) -> None:
    answers = await asyncio.gather(*(
        jp_fetch("infer", "generate", method="POST", body=json.dumps({"prompt": p, "max_tokens": 6}))
        for p in ("hello world", "the cat sat", "once upon a time")
    ))
    answers = [json.loads(a.body) for a in answers]
    assert len({a["batch"]["id"] for a in answers}) == 1  # one window batch
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["engine"] == "hf" and status["model"] == str(tiny_model_dir)

    chunks: list[bytes] = []
    await jp_fetch("infer", "generate_stream", method="POST", streaming_callback=chunks.append,
                   body=json.dumps({"prompt": "hello world", "max_tokens": 6}))
    events, _ = parse_sse(b"".join(chunks).decode())
    assert [e.event for e in events[-2:]] == ["result", "done"]
    assert "".join(e.data for e in events if e.event == "token") == answers[0]["text"]
    # The true token count comes with the result (fragments are not tokens).
    assert json.loads(events[-2].data)["usage"] == answers[0]["usage"]

    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)
    try:
        model = (await api.models.list()).data[0].id
        assert model == str(tiny_model_dir)
        completion = await api.completions.create(model=model, prompt="hello world", max_tokens=5, temperature=0)
        assert completion.usage.completion_tokens <= 5
        stream = await api.chat.completions.create(
            model=Path(model).name, messages=[{"role": "user", "content": "hello"}], max_tokens=5, stream=True,
        )
        assert [chunk async for chunk in stream]
    finally:
        await api.close()
