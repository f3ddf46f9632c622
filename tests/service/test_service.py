"""The service end to end with the simulated engine: batching, streaming, cancellation,
failures, through ``InferenceService`` (policy decisions alone: test_scheduler_core.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from server_helpers import eventually

from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.errors import EngineUnavailable, InvalidRequest, QueueFull, RequestFailed
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

pytestmark = pytest.mark.asyncio


def fast_engine(**kw) -> SimulatedEngine:
    kw.setdefault("token_delay_ms", (1.0, 1.0))
    return SimulatedEngine(prefill_ms_per_token=0.0, prefill_base_ms=0.0, **kw)


class PoisonEngine(SimulatedEngine):
    """Fails any step that holds a row whose prompt says POISON."""

    def prefill(self, seqs, *args):
        if any("POISON" in s.request.prompt for s in seqs):
            raise RuntimeError("poisoned row")
        return super().prefill(seqs, *args)


async def started(engine, **config) -> InferenceService:
    service = InferenceService(ServiceConfig(**config), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready(10)
    return service


def req(prompt: str = "What is dynamic batching?", max_tokens: int = 8, **kw) -> Request:
    priority = kw.pop("priority", 0)
    return Request(prompt, SamplingParams(max_tokens=max_tokens, **kw), priority=priority)


async def test_window_groups_concurrent_requests_and_17th_waits() -> None:
    s = await started(fast_engine(), mode="window", batch_window_ms=200, max_batch_size=16)
    streams = [await s.submit(req(f"batching question {i}")) for i in range(17)]
    results = await asyncio.gather(*(st.result() for st in streams))
    first = {r.batch_id for r in results[:16]}
    assert len(first) == 1 and results[0].batch_size == 16
    assert results[16].batch_id not in first and results[16].batch_size == 1
    await s.stop()


async def test_window_expiry_closes_a_partial_batch() -> None:
    s = await started(fast_engine(), mode="window", batch_window_ms=120, max_batch_size=16)
    streams = [await s.submit(req(f"attention {i}")) for i in range(3)]
    results = await asyncio.gather(*(st.result() for st in streams))
    assert {r.batch_id for r in results} == {results[0].batch_id}
    assert results[0].batch_size == 3
    # Nobody filled the batch, so it closed when the window ran out, not before (a window
    # that never closed would hang the gather above until the test's timeout).
    assert min(r.queued_ms for r in results) >= 100
    await s.stop()


@pytest.mark.parametrize("mode", ["window", "continuous"])
async def test_stream_delivers_every_token_in_order(mode: str) -> None:
    s = await started(fast_engine(), mode=mode, batch_window_ms=10)
    stream = await s.submit(req("Explain the KV cache", max_tokens=30))
    events = [ev async for ev in stream]
    result = await stream.result()
    assert [ev.index for ev in events] == sorted(ev.index for ev in events)
    assert "".join(ev.text for ev in events) == result.text
    assert result.completion_tokens == 30 and result.finish_reason == "length"
    assert "KV cache" in result.text or "cache" in result.text
    await s.stop()


async def test_continuous_newcomer_joins_running_batch() -> None:
    s = await started(fast_engine(token_delay_ms=(5.0, 5.0)), mode="continuous")
    long = await s.submit(req("Tell me about transformers", max_tokens=60))
    five_tokens = asyncio.Event()

    async def consume() -> int:
        count = 0
        async for ev in long:
            count += 1
            if ev.index >= 5:
                five_tokens.set()
        return count

    consumer = asyncio.create_task(consume())
    await five_tokens.wait()
    late = await s.submit(req("And embeddings?", max_tokens=5))
    late_result = await late.result()
    # The newcomer finished while the long request was still running: it did not wait for
    # it (its queue time is a small part of the long one's run, however slow the machine).
    assert not long.done
    long_result = await long.result()
    assert late_result.queued_ms < long_result.total_ms / 4 and late_result.batch_size == 2
    assert long_result.completion_tokens == 60 and await consumer >= 50
    await s.stop()


async def test_cancel_queued_and_running_without_harming_batch_mates() -> None:
    s = await started(fast_engine(token_delay_ms=(3.0, 3.0)), mode="window", batch_window_ms=20, max_batch_size=3)
    running = [await s.submit(req(f"rag {i}", max_tokens=40)) for i in range(3)]
    queued = await s.submit(req("queued one", max_tokens=40))
    await asyncio.sleep(0.1)
    assert s.batches()["waiting"] == [queued.id]
    assert s.cancel(queued.id)
    assert (await queued.result()).finish_reason == "cancelled"
    victim = running[1]
    async for ev in victim:
        if ev.index >= 3:
            break  # walking away from the stream cancels the request
    others = await asyncio.gather(running[0].result(), running[2].result())
    victim_result = await victim.result()
    assert victim_result.finish_reason == "cancelled"
    assert victim_result.completion_tokens < 40
    assert all(r.completion_tokens == 40 for r in others)
    assert s.num_running == 0 and s.queue_depth == 0  # no slot leaked
    snap = s.metrics()
    assert snap["requests"]["cancelled"] == 2 and snap["requests"]["ok"] == 2
    await s.stop()


async def test_engine_failure_fails_only_that_step_and_scheduler_keeps_serving() -> None:
    s = await started(PoisonEngine(prefill_ms_per_token=0, prefill_base_ms=0, token_delay_ms=(1, 1)),
                      mode="continuous")
    bad = await s.submit(req("POISON pill"))
    with pytest.raises(RequestFailed, match="poisoned row"):
        await bad.result()
    with pytest.raises(RequestFailed):
        async for _ in await s.submit(req("POISON again")):
            pass
    good = await (await s.submit(req("What is attention?"))).result()
    assert good.completion_tokens == 8
    assert s.metrics()["requests"]["failed"] == 2
    await s.stop()


async def test_priority_orders_admission() -> None:
    s = await started(fast_engine(), mode="window", batch_window_ms=50, max_batch_size=2)
    low = [await s.submit(req(f"low {i}", priority=0)) for i in range(2)]
    high = await s.submit(req("high", priority=5))
    results = await asyncio.gather(*(st.result() for st in low), high.result())
    by_id = {r.id: r for r in results}
    # Highest priority first, then FIFO: the high one rides in the first batch with low[0].
    assert by_id[high.id].batch_id == by_id[low[0].id].batch_id
    assert by_id[low[1].id].batch_id > by_id[high.id].batch_id
    await s.stop()


async def test_queue_full_rejects_without_queueing() -> None:
    s = await started(fast_engine(token_delay_ms=(20.0, 20.0)), mode="window", batch_window_ms=5,
                      max_batch_size=1, max_queue_size=2)
    first = await s.submit(req(max_tokens=20))
    await asyncio.sleep(0.05)  # first is running now
    queued = [await s.submit(req()) for _ in range(2)]
    with pytest.raises(QueueFull, match="queue is full"):
        await s.submit(req())
    assert s.queue_depth == 2
    assert s.metrics()["requests"]["rejected"] == 1
    await asyncio.gather(first.result(), *(q.result() for q in queued))
    await s.stop()


async def test_limits_rejected_before_queueing() -> None:
    s = await started(fast_engine(), max_prompt_tokens=10, max_new_tokens=50)
    with pytest.raises(InvalidRequest, match="max_prompt_tokens"):
        await s.submit(req("word " * 50))
    with pytest.raises(InvalidRequest, match="max_new_tokens"):
        await s.submit(req(max_tokens=51))
    assert s.queue_depth == 0 and s.metrics()["requests"]["rejected"] == 2
    await s.stop()


async def test_an_open_max_tokens_runs_to_the_context_by_default() -> None:
    """No max_tokens (OpenAI's default): as many as the context leaves, as vLLM and Ollama
    allow, not a cap of this server's (unless InferApp.max_new_tokens sets one)."""
    s = await started(fast_engine(max_context=100))
    seq = await s._loop.prepare(req("one two three", max_tokens=None))
    assert seq.params.max_tokens == 100 - seq.num_prompt_tokens
    capped = await started(fast_engine(max_context=100), max_new_tokens=20)
    assert (await capped._loop.prepare(req("one two three", max_tokens=None))).params.max_tokens == 20
    await s.stop()
    await capped.stop()


async def test_stop_sequence_truncates_and_is_never_streamed() -> None:
    s = await started(fast_engine())
    full = await (await s.submit(req("What is attention?", max_tokens=40))).result()
    words = full.text.split()
    stop = f"{words[3]} {words[4]}"
    stream = await s.submit(req("What is attention?", max_tokens=40, stop=(stop,)))
    streamed = "".join([ev.text async for ev in stream])
    result = await stream.result()
    assert result.finish_reason == "stop"
    assert stop not in streamed and streamed == result.text
    assert full.text.startswith(result.text) and full.text[len(result.text):].startswith(stop)
    await s.stop()


async def test_stop_ends_running_requests_with_an_error() -> None:
    s = await started(fast_engine(token_delay_ms=(20.0, 20.0)))
    stream = await s.submit(req(max_tokens=100))
    await asyncio.sleep(0.1)
    await s.stop()
    with pytest.raises(EngineUnavailable, match="shutting down"):
        await asyncio.wait_for(stream.result(), 5)


async def test_batch_records_and_metrics() -> None:
    s = await started(fast_engine(), mode="continuous")
    streams = [await s.submit(req(f"embeddings {i}", max_tokens=4 + 4 * i)) for i in range(3)]
    await asyncio.gather(*(st.result() for st in streams))
    await asyncio.sleep(0.02)
    batches = s.batches()["batches"]
    # Continuous mode: a record per span of constant membership, shrinking as rows finish.
    assert [b["size"] for b in batches] == [3, 2, 1]
    assert sum(b["tokens"] for b in batches) == 4 + 8 + 12
    snap = s.metrics()
    assert snap["requests"]["ok"] == 3 and snap["tokens"]["completion"] == 24
    assert snap["ttft_ms"]["p50"] is not None and snap["latency_ms"]["p99"] is not None
    assert snap["batch_size_histogram"] and snap["mean_batch_size"] > 1
    await s.stop()


async def test_live_events_tell_the_whole_story() -> None:
    s = await started(fast_engine(), mode="continuous")
    sub = s.subscribe()
    results = await asyncio.gather(*[(await s.submit(req(f"agents {i}", max_tokens=3))).result() for i in range(2)])
    kinds: dict[str, list[dict]] = {}
    while (event := await sub.get(timeout=0.2)) is not None:
        kinds.setdefault(event["type"], []).append(event)
    assert {e["id"] for e in kinds["queued"]} == {r.id for r in results}
    assert {e["batch_id"] for e in kinds["admitted"]} == {results[0].batch_id}
    assert [e["kind"] for e in kinds["step"]][:2] == ["prefill", "decode"]
    assert sum(1 for e in kinds["token"]) == 6
    assert {e["outcome"] for e in kinds["finished"]} == {"ok"}
    sub.close()
    await s.stop()


async def test_rows_that_finish_together_close_one_span() -> None:
    s = await started(fast_engine(), mode="continuous")
    streams = [await s.submit(req(f"rag {i}", max_tokens=5)) for i in range(4)]
    await asyncio.gather(*(st.result() for st in streams))
    assert [b["size"] for b in s.batches()["batches"]] == [4]
    await s.stop()


async def test_idle_engine_lets_a_trickling_burst_share_one_prefill() -> None:
    s = await started(fast_engine(), mode="continuous", idle_admit_delay_ms=12)
    streams = []
    for i in range(4):  # gaps of ~5 ms, spread over ~15 ms: longer than the delay itself
        streams.append(await s.submit(req(f"lora {i}", max_tokens=3)))
        await asyncio.sleep(0.005)
    results = await asyncio.gather(*(st.result() for st in streams))
    assert {r.batch_id for r in results} == {results[0].batch_id} and results[0].batch_size == 4
    await s.stop()


@pytest.mark.parametrize("mode", ["window", "continuous"])
async def test_a_bad_prompt_does_not_take_down_the_requests_admitted_with_it(mode: str) -> None:
    s = await started(PoisonEngine(prefill_ms_per_token=0, prefill_base_ms=0, token_delay_ms=(1, 1)),
                      mode=mode, batch_window_ms=20)
    streams = [await s.submit(req(p)) for p in ("What is RAG?", "POISON", "What is LoRA?")]
    outcomes = await asyncio.gather(*(st.result() for st in streams), return_exceptions=True)
    assert isinstance(outcomes[1], RequestFailed)
    assert outcomes[0].completion_tokens == 8 and outcomes[2].completion_tokens == 8
    snap = s.metrics()
    assert snap["requests"]["failed"] == 1 and snap["requests"]["ok"] == 2
    assert s.num_running == 0 and s.queue_depth == 0
    await s.stop()


async def test_stop_waits_for_the_running_step_to_end() -> None:
    class SlowDecode(SimulatedEngine):
        steps_running = 0

        def decode(self, seqs, *args):
            SlowDecode.steps_running += 1
            try:
                return super().decode(seqs, *args)
            finally:
                SlowDecode.steps_running -= 1

    s = await started(SlowDecode(prefill_ms_per_token=0, prefill_base_ms=0, token_delay_ms=(150, 150)))
    stream = await s.submit(req(max_tokens=50))
    await asyncio.sleep(0.2)  # a 150 ms decode step is running now
    await s.stop()
    assert SlowDecode.steps_running == 0  # stop() returned only after the step ended
    with pytest.raises(EngineUnavailable):
        await stream.result()


async def test_batches_answers_the_same_amount_as_asked() -> None:
    s = await started(fast_engine(), mode="continuous", max_batch_size=1)
    streams = [await s.submit(req(f"rag {i}", max_tokens=2)) for i in range(60)]
    await asyncio.gather(*(st.result() for st in streams))
    answer = s.batches(limit=60)
    assert len(answer["batches"]) == 60 and len(answer["requests"]) == 60
    assert len(s.batches(limit=10)["batches"]) == 10
    await s.stop()


async def test_a_long_prompt_is_chunked_while_a_stream_keeps_its_tokens_coming() -> None:
    engine = fast_engine()
    s = await started(engine, prefill_chunk_tokens=8, idle_admit_delay_ms=0)
    running = await s.submit(req("Explain the KV cache", max_tokens=40))
    events = running.__aiter__()
    await events.__anext__()  # it is decoding
    long_prompt = "Why does batching help on a busy server? " * 6
    n = len(engine.text.tokenize(long_prompt))
    steps = s.subscribe()
    long_ = await s.submit(req(long_prompt, max_tokens=4))
    result = await long_.result()
    # Everything published since it subscribed: ceil(n / 8) chunks, each inside a step of the
    # running stream (a mixed step), which so never sits a step out for the long prompt.
    chunks = [e.event for e in steps.take()[0] if e.event["type"] == "step" and e.event["chunk"]]
    assert len(chunks) == -(-n // 8)
    assert all(e["kind"] == "mixed" and e["members"][0] == running.id for e in chunks)
    assert result.completion_tokens == 4 and result.text
    assert (await running.result()).completion_tokens == 40
    await s.stop()


async def test_status_shows_the_chunk_size_in_use() -> None:
    s = await started(fast_engine())
    assert s.status()["limits"]["prefill_chunk_tokens"] == 64  # the engine's own
    await s.stop()
    s = await started(fast_engine(), prefill_chunk_tokens=0)
    assert s.status()["limits"]["prefill_chunk_tokens"] == 0
    await s.stop()


async def test_a_cancel_during_a_routers_fallback_reaches_the_fallback() -> None:
    """The router moves a request that failed before its first token to its fallback; a
    cancel that lands while the fallback backend takes it (here: still loading) must not be
    lost between the two backends, or the request runs on for nobody."""
    import threading

    from jupyter_infer.service.router import RouterService

    loaded = threading.Event()

    def slow_load() -> SimulatedEngine:
        loaded.wait(10)
        return fast_engine()

    config = ServiceConfig(engine="router", router_policies=(), router_fallback={"first": "second"},
                           router_backends={"first": {"engine": "simulated"}, "second": {"engine": "simulated"}})
    router = RouterService(config, loaders={
        "first": lambda: PoisonEngine(prefill_ms_per_token=0, prefill_base_ms=0), "second": slow_load})
    router.start()
    await router.backends["first"].wait_ready(10)
    stream = await router.submit(req("POISON: fails on the first backend", max_tokens=200))
    await eventually(lambda: router.fallbacks["first->second"] == 1)
    assert router.cancel(stream.id)  # the request is between its two backends
    loaded.set()
    result = await asyncio.wait_for(stream.result(), 10)
    assert result.finish_reason == "cancelled" and result.completion_tokens < 200
    await router.stop()


async def test_a_cancelled_prompt_part_way_through_its_prefill_frees_its_rows_at_once() -> None:
    """Its KV (room for the whole prompt) goes when it leaves, not at the next step, which an
    idle server may not run for a long time."""
    s = await started(fast_engine(token_delay_ms=(30, 30)), prefill_chunk_tokens=4, idle_admit_delay_ms=0)
    short = await s.submit(req("hi", max_tokens=30))
    loop = s._loop
    await eventually(lambda: loop.counts()[1] == 1 and short.done is False)
    long_ = await s.submit(req("Explain continuous batching, chunked prefill and the KV cache in depth", max_tokens=2))
    await eventually(lambda: long_.id in loop.engine.held_rows().prefilling)
    s.cancel(long_.id)
    s.cancel(short.id)
    await eventually(lambda: loop.counts() == (0, 0))
    await eventually(lambda: loop.engine.held_rows().ids == [])  # the engine let go of both rows
    await s.stop()


async def test_an_idle_engine_hands_its_freed_heap_back_once_nothing_has_run_for_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_infer.loops import engine_loop

    trims: list[float] = []
    monkeypatch.setattr(engine_loop, "release_freed", lambda: trims.append(time.monotonic()))
    quiet = engine_loop.EngineLoop.IDLE_TRIM_S
    s = await started(fast_engine(), mode="continuous")
    await asyncio.sleep(quiet * 1.5)
    assert trims == []  # nothing has run yet: nothing to give back
    for _ in range(3):  # requests that follow each other closely never wait for a trim
        await (await s.submit(req(max_tokens=4))).result()
        await asyncio.sleep(0.05)
    assert trims == []
    await eventually(lambda: len(trims) == 1, timeout=5)
    await asyncio.sleep(quiet * 1.5)
    assert len(trims) == 1  # once per quiet spell, not every wake-up
    await (await s.submit(req(max_tokens=4))).result()
    await eventually(lambda: len(trims) == 2, timeout=5)
    await s.stop()
