"""engine = "openai" through ``InferenceService``, against a scripted upstream on loopback:
pass-through, what is forwarded, the in-flight bound, cancellation, and every fault a user
can meet (unreachable, overloaded, failing, slow, broken mid-stream) with its status."""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import eventually
from upstream_helpers import MODEL, ScriptedUpstream

from jupyter_infer.errors import (
    EngineUnavailable,
    InvalidRequest,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

pytestmark = pytest.mark.asyncio


async def front(upstream: ScriptedUpstream, **config) -> InferenceService:
    config.setdefault("idle_admit_delay_ms", 0.0)
    service = InferenceService(ServiceConfig(engine="openai", upstream_url=upstream.url, **config))
    service.start()
    await service.wait_ready(10)
    return service


def req(prompt: str = "Hello", max_tokens: int = 4, priority: int = 0, **params) -> Request:
    return Request(prompt, SamplingParams(max_tokens=max_tokens, **params), priority=priority)


async def test_text_passes_through_chunk_by_chunk_with_the_upstreams_usage(monkeypatch) -> None:
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-secret-123")
    up = ScriptedUpstream().start()
    s = await front(up, upstream_api_key_env="TEST_UPSTREAM_KEY")
    stream = await s.submit(req(max_tokens=5, temperature=0.5, stop=["END"], seed=7))
    assert stream.model == MODEL  # the upstream's first model, found in its v1/models
    fragments = [ev.text async for ev in stream]
    result = await stream.result()
    assert fragments == ["w0 ", "w1 ", "w2 ", "w3 ", "w4 "] and result.text == "".join(fragments)
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (up.PROMPT_TOKENS, 5, "length")
    body = up.bodies[0]
    assert body["model"] == MODEL and body["prompt"] == "Hello" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["stop"], body["seed"], body["max_tokens"]) == (0.5, ["END"], 7, 5)
    assert up.headers[0]["Authorization"] == "Bearer sk-secret-123"
    status = s.status()
    assert status["engine"] == "openai" and status["upstream"]["reachable"] is True
    assert "sk-secret" not in repr(status) and "sk-secret" not in repr(s.config)
    assert "upstream spans" in status["timeline"]
    await s.stop()
    await up.stop()


async def test_a_chat_goes_upstream_as_messages_not_rendered_here() -> None:
    up = ScriptedUpstream().start()
    s = await front(up)
    chat = Request("", SamplingParams(max_tokens=2), messages=[{"role": "user", "content": "Hi there"}])
    result = await (await s.submit(chat)).result()
    assert result.text == "w0 w1 "
    assert up.bodies[0]["messages"] == [{"role": "user", "content": "Hi there"}] and "prompt" not in up.bodies[0]
    await s.stop()
    await up.stop()


async def test_max_batch_size_bounds_what_is_in_flight_and_priority_starts_first() -> None:
    up = ScriptedUpstream(delay_s=0.01).start()
    s = await front(up, max_batch_size=2)
    streams = [await s.submit(req(f"low {i}", max_tokens=6)) for i in range(4)]
    await eventually(lambda: up.open_streams == 2)
    streams.append(await s.submit(req("high", max_tokens=6, priority=5)))
    results = await asyncio.gather(*(st.result() for st in streams))
    assert all(r.completion_tokens == 6 for r in results)
    assert up.most_open == 2  # the rest waited in our queue, not upstream
    order = [b["prompt"] for b in up.bodies]
    assert order.index("high") == 2  # the first free slot went to the high priority
    spans = s.batches()["batches"]
    assert spans and all(b["source"] == "upstream" and b["size"] <= 2 for b in spans)
    assert s.metrics()["requests"]["ok"] == 5
    await s.stop()
    await up.stop()


async def test_cancel_closes_the_upstream_stream_at_once() -> None:
    up = ScriptedUpstream(delay_s=0.05).start()
    s = await front(up)
    stream = await s.submit(req(max_tokens=500))
    async for event in stream:
        if event.index == 2:
            break  # leaving the stream cancels the request
    await eventually(lambda: up.disconnects == 1 and up.open_streams == 0, timeout=2)
    result = await stream.result()
    assert result.finish_reason == "cancelled" and result.completion_tokens == 2
    assert s.metrics()["requests"]["cancelled"] == 1 and s.num_running == 0
    await s.stop()
    await up.stop()


async def test_an_unreachable_upstream_is_503_after_retries_and_recovery_is_noticed() -> None:
    up = ScriptedUpstream()  # not started: nothing listens on its port
    s = await front(up, upstream_model=MODEL, upstream_retries=2)
    assert s.status()["upstream"]["reachable"] is False and s.status()["state"] == "unreachable"
    stream = await s.submit(req())
    with pytest.raises(UpstreamUnavailable) as caught:
        await stream.result()
    assert caught.value.status == 503 and up.url in caught.value.message
    assert "retried 2 time(s)" in caught.value.message
    assert s.metrics()["requests"]["failed"] == 1
    up.start()  # it comes back: the watcher's probe sees it without any request
    await eventually(lambda: s.status()["upstream"]["reachable"] is True, timeout=10)
    assert s.state == "ready"
    assert (await (await s.submit(req())).result()).text == "w0 w1 w2 w3 "
    await s.stop()
    await up.stop()


async def test_a_blip_before_the_first_token_is_retried_away() -> None:
    up = ScriptedUpstream(fail_next=1, fail_status=503).start()
    s = await front(up)
    result = await (await s.submit(req(max_tokens=2))).result()
    assert result.text == "w0 w1 " and len(up.bodies) == 2
    await s.stop()
    await up.stop()


@pytest.mark.parametrize(("status", "error", "code"), [
    (500, UpstreamError, 502), (400, InvalidRequest, 400), (429, UpstreamUnavailable, 503),
])
async def test_upstream_errors_carry_its_message_with_a_truthful_status(status, error, code) -> None:
    up = ScriptedUpstream(fail_next=10, fail_status=status, fail_message="GPU on fire").start()
    s = await front(up, upstream_retries=1, upstream_timeout_s=5)
    with pytest.raises(error) as caught:
        await (await s.submit(req())).result()
    assert caught.value.status == code and "GPU on fire" in caught.value.message
    assert len(up.bodies) == (2 if code == 503 else 1)  # only overload is retried
    await s.stop()
    await up.stop()


async def test_a_slow_upstream_is_504() -> None:
    up = ScriptedUpstream(first_delay_s=3).start()
    s = await front(up, upstream_timeout_s=0.5)
    with pytest.raises(UpstreamTimeout) as caught:
        await (await s.submit(req())).result()
    assert caught.value.status == 504 and "upstream_timeout_s" in caught.value.message
    await s.stop()
    await up.stop()


async def test_a_stream_broken_mid_way_ends_with_an_error_after_the_text_so_far() -> None:
    up = ScriptedUpstream(drop_after=3).start()
    s = await front(up)
    stream = await s.submit(req(max_tokens=10))
    seen = []
    with pytest.raises(UpstreamError, match="broke the stream|closed the stream"):
        async for event in stream:
            seen.append(event.text)
    assert seen == ["w0 ", "w1 ", "w2 "] and len(up.bodies) == 1  # no retry after text
    up.drop_after = None
    assert (await (await s.submit(req(max_tokens=1))).result()).text == "w0 "
    await s.stop()
    await up.stop()


async def test_a_missing_key_variable_fails_the_service_with_what_to_do(monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    up = ScriptedUpstream().start()
    s = InferenceService(ServiceConfig(engine="openai", upstream_url=up.url, upstream_api_key_env="NO_SUCH_KEY"))
    s.start()
    with pytest.raises(EngineUnavailable, match="NO_SUCH_KEY"):
        await s.wait_ready(10)
    assert s.state == "failed"
    await s.stop()
    await up.stop()


async def test_stop_ends_running_requests_and_closes_their_upstream_streams() -> None:
    up = ScriptedUpstream(delay_s=0.05).start()
    s = await front(up)
    stream = await s.submit(req(max_tokens=500))
    await eventually(lambda: up.open_streams == 1)
    await s.stop()
    with pytest.raises(EngineUnavailable):
        await stream.result()
    await eventually(lambda: up.open_streams == 0, timeout=2)
    await up.stop()


async def test_what_needs_a_local_tokenizer_is_refused_with_why() -> None:
    up = ScriptedUpstream().start()
    s = await front(up)
    token_prompt = Request("", SamplingParams(max_tokens=4), prompt_ids=[1, 2, 3])
    with pytest.raises(InvalidRequest, match="send the prompt as text"):
        await s.submit(token_prompt)
    with pytest.raises(InvalidRequest, match="not passed back"):
        await s.submit(req(logprobs=2))
    with pytest.raises(InvalidRequest, match="no tokenizer of its own"):
        await s.tokenize("hello")
    assert not up.bodies and s.metrics()["requests"]["rejected"] == 2  # nothing went upstream
    await s.stop()
    await up.stop()


async def test_a_finished_request_is_known_for_an_eventsource_reconnect() -> None:
    up = ScriptedUpstream().start()
    s = await front(up)
    stream = await s.submit(req())
    await stream.result()
    assert s.knows(stream.id) and not s.knows("req-never-seen")
    await s.stop()
    await up.stop()
