"""The live event bus: one shared log, readers at their own pace, a cap, drops counted."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_infer.errors import TooManySubscribers
from jupyter_infer.values.events import EventBus, coalesce_tokens

pytestmark = pytest.mark.asyncio


async def test_every_reader_gets_every_event_in_order() -> None:
    bus = EventBus(flush_interval_s=0.01)
    readers = [bus.subscribe() for _ in range(3)]
    for i in range(5):
        bus.publish({"type": "token", "index": i})
    for reader in readers:
        got = [await reader.get(timeout=1) for _ in range(5)]
        assert [e["index"] for e in got] == list(range(5))
        assert await reader.get(timeout=0.05) is None


async def test_a_reader_starts_at_the_next_event_and_a_waiting_one_wakes() -> None:
    bus = EventBus(flush_interval_s=0.01)
    early = bus.subscribe()
    bus.publish({"type": "queued"})
    late = bus.subscribe()
    waiting = asyncio.ensure_future(late.get(timeout=5))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    bus.publish({"type": "admitted"})
    assert (await asyncio.wait_for(waiting, 1))["type"] == "admitted"
    assert (await early.get(timeout=1))["type"] == "queued"


async def test_the_number_of_readers_is_capped_and_refusals_counted() -> None:
    bus = EventBus(max_subscribers=2)
    first, _ = bus.subscribe(), bus.subscribe()
    with pytest.raises(TooManySubscribers, match="InferApp.max_event_subscribers") as info:
        bus.subscribe()
    assert info.value.status == 429 and info.value.retry_after > 0
    first.close()
    bus.subscribe()  # a place freed
    assert bus.stats() == {"subscribers": 2, "dropped": 0, "refused": 1}


async def test_a_reader_that_falls_behind_loses_the_oldest_and_is_told() -> None:
    bus = EventBus(capacity=10)
    dropped: list[int] = []
    bus.on_dropped.append(dropped.append)
    slow, keeping_up = bus.subscribe(), bus.subscribe()
    for i in range(25):
        bus.publish({"type": "token", "index": i})
        if i % 5 == 4:
            keeping_up.take()
    first = await slow.get(timeout=1)
    assert first == {"type": "dropped", "count": 15}
    assert [(await slow.get(timeout=1))["index"] for _ in range(10)] == list(range(15, 25))
    assert bus.dropped == 15 and dropped == [15] and keeping_up.dropped == 0
    assert len(bus._log) <= 10  # memory is the shared log's, whatever the readers do


async def test_what_readers_take_is_rendered_once_for_all_of_them() -> None:
    bus = EventBus()
    readers = [bus.subscribe() for _ in range(50)]
    calls: list[list[str]] = []

    def render(events: list[dict]) -> str:
        calls.append([e["type"] for e in events])
        return "".join(e["type"] + "\n" for e in events)

    bus.publish({"type": "queued"})
    bus.publish({"type": "finished"})
    texts = {bus.render(reader.take()[0], render) for reader in readers}
    assert texts == {"queued\nfinished\n"} and calls == [["queued", "finished"]]


async def test_a_requests_tokens_are_coalesced_where_its_first_was() -> None:
    events = [{"type": "token", "id": "a", "index": 1, "text": "He"}, {"type": "token", "id": "b", "index": 1, "text": "x"},
              {"type": "step", "tokens": 2}, {"type": "token", "id": "a", "index": 2, "text": "llo"},
              {"type": "finished", "id": "a"}]
    assert coalesce_tokens(events) == [
        {"type": "token", "id": "a", "index": 2, "text": "Hello"}, {"type": "token", "id": "b", "index": 1, "text": "x"},
        {"type": "step", "tokens": 2}, {"type": "finished", "id": "a"}]
    assert events[0]["text"] == "He"  # the log's own events are left as they were


async def test_wakeups_are_batched_and_spread_out() -> None:
    bus = EventBus(flush_interval_s=0.05, max_subscribers=200)
    readers = [bus.subscribe() for _ in range(200)]
    waits = [asyncio.ensure_future(r.wait(timeout=5)) for r in readers]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(100):  # a burst of events: one wake-up for it, not one per event
        bus.publish({"type": "token", "index": i})
    assert not any(w.done() for w in waits)
    assert await asyncio.gather(*waits) == [True] * 200
    # 200 readers: the interval grows to 1 ms a reader (200 ms)
    assert loop.time() - started >= 0.19
    assert all(len(r.take()[0]) == 100 for r in readers)


async def test_closing_wakes_the_reader_and_the_last_one_out_clears_the_log() -> None:
    bus = EventBus()
    reader = bus.subscribe()
    bus.publish({"type": "queued"})
    reader.take()
    waiting = asyncio.ensure_future(reader.wait(timeout=30))
    await asyncio.sleep(0)
    reader.close()
    assert await asyncio.wait_for(waiting, 1) is False
    assert len(bus) == 0 and not bus._log
    bus.publish({"type": "token"})  # nobody listens: nothing is kept
    assert not bus._log
