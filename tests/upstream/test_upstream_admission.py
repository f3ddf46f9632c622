"""engine = "openai" without I/O: the upstream's admission core (``upstream/admission.py``)
with a fake clock: who goes upstream now, spans, cancellation and every request's end."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import QueueFull
from jupyter_infer.scheduler import Recorder
from jupyter_infer.upstream.admission import UpstreamAdmission
from jupyter_infer.upstream.upstream_sequence import UpstreamSequence
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.events import EventBus
from jupyter_infer.values.metrics import MetricsCollector
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Status

URL = "http://upstream.test/v1"


def core(**config) -> UpstreamAdmission:
    config.setdefault("idle_admit_delay_ms", 0.0)
    cfg = ServiceConfig(engine="openai", upstream_url=URL, **config)
    return UpstreamAdmission(cfg, Recorder(cfg.mode, MetricsCollector(), EventBus(), source="upstream"))


def seq(prompt: str = "hello", priority: int = 0, prompt_tokens: int = 2) -> UpstreamSequence:
    return UpstreamSequence(Request(prompt, SamplingParams(max_tokens=8), priority=priority), [],
                    prompt_tokens=prompt_tokens)


def test_max_batch_size_bounds_requests_in_flight_and_a_free_slot_starts_the_next() -> None:
    s = core(max_batch_size=2)
    rows = [seq() for _ in range(3)]
    for x in rows:
        s.add(x, 0.0)
    started, _ = s.start(0.0)
    assert started == rows[:2] and rows[2].status is Status.WAITING
    assert s.start(0.01) == ([], None)  # full: nothing starts until one leaves
    s.receive(rows[0], "a", 0.02)
    s.complete(rows[0], "stop", 0.03)
    assert s.start(0.03)[0] == [rows[2]]  # no step boundary to wait for


def test_priorities_start_first_and_long_prompts_are_not_held_back() -> None:
    s = core(max_batch_size=2, max_prefill_tokens=10)
    low, high = seq(prompt_tokens=900), seq(priority=3, prompt_tokens=900)
    s.add(low, 0.0)
    s.add(high, 0.0)
    # The upstream pads and batches on its own: the local prefill budget does not apply.
    assert s.start(0.0)[0] == [high, low]


def test_queue_full_is_429_without_queueing() -> None:
    s = core(max_batch_size=1, max_queue_size=1)
    s.add(seq(), 0.0)
    s.start(0.0)  # in flight: it no longer counts against the queue
    s.add(seq(), 0.0)
    with pytest.raises(QueueFull):
        s.add(seq(), 0.0)
    assert len(s.waiting) == 1 and len(s.running) == 1


def test_requests_that_finish_together_close_one_span() -> None:
    s = core(max_batch_size=4, idle_admit_delay_ms=5)
    rows = [seq() for _ in range(4)]
    for x in rows:
        s.add(x, 0.0)
    s.start(0.0)
    s.start(0.006)  # the idle wait for a burst: all four start together
    for i, x in enumerate(rows[:3]):  # three finish a millisecond apart, each on its own chunk
        s.complete(x, "length", 1.0 + i / 1000)
    assert s.start(1.002) == ([], pytest.approx(1.005))  # their span closes once, a bit later
    s.start(1.005)
    s.complete(rows[3], "length", 2.0)
    spans = list(s.recorder.metrics.batches)
    assert [len(sp.members) for sp in spans] == [4, 1]
    assert spans[0].ended_at == spans[1].started_at == pytest.approx(1.005)


def test_a_cancelled_running_request_leaves_at_once_and_its_late_text_is_dropped() -> None:
    s = core(max_batch_size=4)
    a, b = seq(), seq()
    s.add(a, 0.0)
    s.add(b, 0.0)
    s.start(0.0)
    assert s.cancel(a.id, 0.01) and a.status is Status.FINISHED
    assert a.record.outcome == "cancelled" and s.running == [b]
    assert s.receive(a, "late", 0.02) == "" and a.text == ""
    assert [x.id for x in s.queue.pop_finished()] == [a.id]
    assert not s.cancel(a.id, 0.03)


def test_spans_follow_what_is_in_flight_and_count_streamed_tokens() -> None:
    s = core(max_batch_size=4)
    a, b = seq(), seq()
    s.add(a, 0.0)
    s.add(b, 0.0)
    s.start(0.0)
    for t, x in ((0.1, a), (0.1, b), (0.2, a)):
        s.receive(x, "w", t)
    s.complete(a, "length", 0.3, usage=(7, 2))
    s.start(0.3)
    s.receive(b, "w", 0.4)
    s.fail_request(b, "the upstream broke", 0.5)
    spans = list(s.recorder.metrics.batches)
    assert [(sp.members, sp.tokens, sp.source) for sp in spans] == [
        ([a.id, b.id], 3, "upstream"), ([b.id], 1, "upstream")]
    assert a.record.prompt_tokens == 7 and a.record.completion_tokens == 2  # the upstream's usage
    assert b.record.outcome == "failed" and b.record.error == "the upstream broke"
    metrics = s.recorder.metrics
    assert metrics.prompt_tokens == 7 + 2  # a: reported; b: its estimate (it never reported)
    assert metrics.busy_s == pytest.approx(0.5)  # something was in flight from 0.0 to 0.5
    assert metrics.snapshot()["requests"]["ok"] == 1
