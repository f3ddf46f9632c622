"""The server with a real (tiny, locally built) Hugging Face model behind it."""

from __future__ import annotations

import asyncio
import json
import os
import time
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


async def test_prefix_cache_hits_show_in_status_metrics_and_prometheus(jp_fetch: Any) -> None:
    system = "You are a careful assistant inside a notebook; answer briefly and cite sources. " * 2
    for question in ("What is a KV cache?", "What is batching?"):
        await jp_fetch("infer", "generate", method="POST",
                       body=json.dumps({"prompt": system + question, "max_tokens": 2}))
    metrics = json.loads((await jp_fetch("infer", "metrics")).body)["prefix_cache"]
    assert metrics["enabled"] and metrics["hits"] == 1 and metrics["misses"] == 1
    assert metrics["reused_tokens"] >= 16 and 0 < metrics["used_mb"] <= metrics["capacity_mb"]
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["prefix_cache"]["capacity_mb"] == 512
    assert status["limits"]["prefill_chunk_tokens"] == 0  # the chunk in use: none in window mode
    prometheus = (await jp_fetch("metrics")).body.decode()
    assert "jupyter_infer_prefix_cache_hits_total 1.0" in prometheus
    assert f"jupyter_infer_prefix_cache_reused_tokens_total {metrics['reused_tokens']:.1f}" in prometheus
    assert "jupyter_infer_prefix_cache_bytes " in prometheus and "jupyter_infer_prefix_cache_blocks " in prometheus
    # Its blocks also go to disk, under the cache root (a restart reads them: test_prompt_disk.py).
    disk = status["prefix_cache"]["disk"]
    assert disk["enabled"] and disk["capacity_mb"] == 4096 and disk["rejected"] == 0
    assert Path(disk["dir"]).is_relative_to(os.environ["JUPYTER_INFER_CACHE"])
    assert "jupyter_infer_prefix_cache_disk_written_blocks_total " in prometheus


async def test_the_kv_memory_of_the_running_rows_shows_in_status_metrics_and_prometheus(
    jp_fetch: Any, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a request runs, status, metrics and /metrics say what its rows hold in KV
    memory; once nothing runs, nothing is held."""
    from server_helpers import eventually, service_of

    service = service_of(jp_serverapp)
    await service.wait_ready(60)
    idle = json.loads((await jp_fetch("infer", "status")).body)["kv_cache"]
    assert idle["bytes_held"] == 0 and idle["tokens_held"] == 0 and idle["bytes_per_token"] > 0
    # The tiny model's 64 steps take ~25 ms, less than a poll and the reads below: each step
    # is made to last 20 ms, so the request is still running while they look.
    engine = service._loop.engine
    execute = engine.execute
    monkeypatch.setattr(engine, "execute", lambda *args: time.sleep(0.02) or execute(*args))
    body = json.dumps({"prompt": "Tell me about batching", "max_tokens": 64, "ignore_eos": True})
    running = asyncio.ensure_future(jp_fetch("infer", "generate", method="POST", body=body))
    await eventually(lambda: (service.kv_cache() or {}).get("tokens_held", 0) > 0)
    held = json.loads((await jp_fetch("infer", "metrics")).body)["kv_cache"]
    assert held["bytes_held"] >= held["tokens_held"] * held["bytes_per_token"] and held["waste_ratio"] >= 1
    assert held["shared_tokens"] == 0  # one request: nothing to share
    prometheus = (await jp_fetch("metrics")).body.decode()
    assert "jupyter_infer_kv_cache_bytes " in prometheus and "jupyter_infer_kv_cache_waste_ratio " in prometheus
    assert "jupyter_infer_kv_cache_shared_tokens 0.0" in prometheus
    await running
    await eventually(lambda: service.kv_cache()["bytes_held"] == 0)
