"""``Client(url=..., api_key=...)`` straight to a plain OpenAI-compatible server (a scripted
one on loopback): generate, stream, burst, cancel, and status/metrics/batches from
client-side timings, labelled as such."""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import eventually
from upstream_helpers import MODEL, ScriptedUpstream

from jupyter_infer.kernel.client import Client
from jupyter_infer.kernel.client.openai_backend import is_openai_url


def test_which_urls_are_plain_openai_servers() -> None:
    assert is_openai_url("http://vllm:8000/v1") and is_openai_url("http://h:8888/infer/v1/")
    assert not is_openai_url("http://127.0.0.1:8888/") and not is_openai_url(None)


@pytest.mark.asyncio
async def test_generate_stream_and_burst_against_a_plain_server() -> None:
    up = ScriptedUpstream(delay_s=0.005).start()
    client = Client(url=up.url, api_key="sk-test")
    assert client.backend == "openai" and "client-side" in str(client.connection)
    status = await client.await_ready(10)
    assert status["engine"] == "openai" and status["model"] == MODEL and status["timings"] == "client-side"

    done = await client.agenerate("Hello", max_tokens=3, temperature=0.2)
    assert (done.text, done.completion_tokens, done.prompt_tokens) == ("w0 w1 w2 ", 3, up.PROMPT_TOKENS)
    assert done.ttft_ms is not None and done.ttft_ms <= done.total_ms
    assert up.headers[-1]["Authorization"] == "Bearer sk-test" and up.bodies[-1]["temperature"] == 0.2

    stream = client.astream("Go on", max_tokens=4)
    assert [f async for f in stream] == ["w0 ", "w1 ", "w2 ", "w3 "]
    assert stream.completion.completion_tokens == 4

    results = await client.aburst([f"prompt {i}" for i in range(4)], max_tokens=5)
    assert [r.completion_tokens for r in results] == [5] * 4
    batches = await client.abatches()
    assert batches["timings"] == "client-side" and "client" in batches["timings_note"]
    burst_ids = {r.id for r in results}
    spans = [b for b in batches["batches"] if burst_ids & set(b["members"])]
    assert spans and spans[0]["source"] == "upstream" and spans[0]["size"] == 4  # in flight together
    metrics = await client.ametrics()
    assert metrics["requests"]["ok"] == 6 and metrics["timings"] == "client-side"
    await client.aclose()
    await up.stop()


@pytest.mark.asyncio
async def test_cancel_closes_the_request_at_the_plain_server() -> None:
    up = ScriptedUpstream(delay_s=0.05).start()
    client = Client(url=up.url)  # a /v1 URL is enough; no key needed here
    stream = client.astream("Long story", max_tokens=200)
    fragments = []
    async for fragment in stream:
        fragments.append(fragment)
        if len(fragments) == 2:
            assert await client.acancel(stream.id)
    await eventually(lambda: up.disconnects == 1 and up.open_streams == 0, timeout=5)
    assert stream.completion.finish_reason == "cancelled"
    await client.aclose()
    await up.stop()


@pytest.mark.asyncio
async def test_an_unreachable_plain_server_fails_fast_with_what_to_check() -> None:
    up = ScriptedUpstream()  # never started
    client = Client(url=up.url, api_key="k", model=MODEL)
    from jupyter_infer.errors import UpstreamUnavailable

    with pytest.raises(UpstreamUnavailable, match="Check that it is running"):
        await asyncio.wait_for(client.agenerate("hi", max_tokens=2), 30)
    await client.aclose()
