"""engine = "openai" without I/O: the upstream scheduling core with a fake clock, the wire
format (what goes upstream, what comes back, errors as ours) and the router's rule."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import (
    InvalidRequest,
    QueueFull,
    RequestFailed,
    UpstreamError,
    UpstreamUnavailable,
)
from jupyter_infer.scheduler import Recorder
from jupyter_infer.service.routing import Rule
from jupyter_infer.upstream.admission import UpstreamAdmission
from jupyter_infer.upstream.upstream_sequence import UpstreamSequence
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.events import EventBus
from jupyter_infer.values.metrics import MetricsCollector
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Status
from jupyter_infer.wire.upstream_openai import (
    error_message,
    estimate_tokens,
    http_error,
    parse_chunk,
    request_body,
)

URL = "http://upstream.test/v1"


def core(**config) -> UpstreamAdmission:
    config.setdefault("idle_admit_delay_ms", 0.0)
    cfg = ServiceConfig(engine="openai", upstream_url=URL, **config)
    return UpstreamAdmission(cfg, Recorder(cfg.mode, MetricsCollector(), EventBus(), source="upstream"))


def seq(prompt: str = "hello", priority: int = 0, prompt_tokens: int = 2) -> UpstreamSequence:
    return UpstreamSequence(Request(prompt, SamplingParams(max_tokens=8), priority=priority), [],
                    prompt_tokens=prompt_tokens)


# -- the core -----------------------------------------------------------------------------------
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


# -- the wire -----------------------------------------------------------------------------------
def test_a_chat_goes_upstream_as_a_chat_and_default_knobs_stay_out() -> None:
    chat = Request("", SamplingParams(max_tokens=5), messages=[{"role": "user", "content": "hi"}])
    path, body = request_body(chat, "m")
    assert path == "chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "messages": body["messages"], "max_tokens": 5, "temperature": 0.0}
    plain = Request("Once", SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=40, seed=3,
                                           stop=("\n", "END")))
    path, body = request_body(plain, "m")
    assert path == "completions" and body["prompt"] == "Once"
    assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")} == {
        "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n", "END"]}


def test_chunks_of_completions_chats_and_usage() -> None:
    assert parse_chunk('{"choices": [{"text": "ab", "finish_reason": null}]}').text == "ab"
    chat = parse_chunk('{"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]}')
    assert (chat.text, chat.finish_reason) == ("x", "length")
    role = parse_chunk('{"choices": [{"delta": {"role": "assistant"}}]}')
    assert role.text == "" and not role.has_usage
    usage = parse_chunk('{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}}')
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 9)
    assert parse_chunk("[DONE]") is None
    with pytest.raises(UpstreamError, match="out of memory"):
        parse_chunk('{"error": {"message": "CUDA out of memory", "type": "server_error"}}')
    with pytest.raises(UpstreamError, match="not JSON"):
        parse_chunk("<html>")


def test_upstream_errors_become_ours_with_its_message() -> None:
    assert error_message(b'{"error": {"message": "bad model"}}') == "bad model"
    assert error_message('{"detail": "Unexpected fields: top_k"}') == "Unexpected fields: top_k"
    assert error_message("{\"error\": \"overloaded\"}") == "overloaded"
    assert error_message(b"Bad Gateway") == "Bad Gateway"
    assert isinstance(http_error(500, b'{"error": "boom"}', URL), UpstreamError)
    busy = http_error(503, b"{}", URL, retry_after="2")
    assert isinstance(busy, UpstreamUnavailable) and busy.retry_after == 2.0
    refused = http_error(422, b'{"detail": "Unexpected fields: top_k"}', URL)
    assert isinstance(refused, InvalidRequest) and "top_k" in refused.message
    assert "upstream_api_key" in http_error(401, b"{}", URL).message
    assert "ending in /v1" in http_error(404, b"{}", URL).message


def test_prompt_size_is_estimated_for_limits_and_rules() -> None:
    assert estimate_tokens(Request("x" * 400)) == 100
    chat = Request("", messages=[{"role": "user", "content": "x" * 40}, {"role": "user", "content": ""}])
    assert estimate_tokens(chat) == 10 + 4 + 4


# -- the router's rule --------------------------------------------------------------------------
BACKENDS = {"local": {"engine": "simulated"}, "cluster": {"engine": "openai", "upstream_url": URL}}


def rule(**config) -> Rule:
    cfg = ServiceConfig(engine="router", router_backends=BACKENDS, **config)
    return Rule(cfg, cfg.backend_configs())


SERVED = {"local": ["local", "simulated"], "cluster": ["cluster", "big-model"]}


def pick(r: Rule, prompt: str = "hi", max_tokens: int = 16, model: str | None = None):
    return r.pick(Request(prompt, SamplingParams(max_tokens=max_tokens), model=model), SERVED)


def test_the_named_model_comes_first_and_never_falls_back() -> None:
    r = rule(router_fallback={"cluster": "local"})
    assert pick(r, model="big-model").backend == "cluster"
    decision = pick(r, "x" * 10_000, model="local")
    assert (decision.backend, decision.reason, decision.fallback) == ("local", "model", None)
    with pytest.raises(InvalidRequest, match="not served here"):
        pick(r, model="gpt-5")


def test_complexity_sends_long_prompts_and_long_answers_to_the_cluster() -> None:
    r = rule(router_complex_prompt_tokens=100, router_complex_max_tokens=200, router_fallback={"cluster": "local"})
    assert pick(r).backend == "local"  # the default: the first backend
    long_prompt = pick(r, "x" * 400)
    assert (long_prompt.backend, long_prompt.reason, long_prompt.fallback) == ("cluster", "complexity", "local")
    assert pick(r, max_tokens=200).backend == "cluster"


def test_sensitive_content_stays_local_whatever_else_it_is() -> None:
    r = rule(router_sensitive_patterns=[r"\bpatient\b", r"\d{3}-\d{2}-\d{4}"], router_complex_prompt_tokens=10,
             router_default="cluster", router_fallback={"local": "cluster"})
    decision = pick(r, "The PATIENT record " + "x" * 100)
    assert (decision.backend, decision.reason) == ("local", "sensitivity")
    assert decision.fallback is None  # its fallback is outside this process
    assert pick(r, "my number is 123-45-6789").backend == "local"
    assert pick(r, "nothing to hide").backend == "cluster"
    with pytest.raises(InvalidRequest, match="must stay in this process"):
        pick(r, "patient notes", model="cluster")


def test_a_callable_policy_decides_in_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    module = types.ModuleType("my_routes")
    module.by_word = lambda request, prompt_tokens: "cluster" if "deep" in request.prompt else None
    module.nonsense = lambda request, prompt_tokens: "mars"
    monkeypatch.setitem(__import__("sys").modules, "my_routes", module)
    r = rule(router_policies=["my_routes:by_word", "complexity"])
    assert pick(r, "a deep question").reason == "callable my_routes:by_word"
    assert pick(r, "a shallow one").backend == "local"
    with pytest.raises(RequestFailed, match="'mars', which is not a backend"):
        pick(rule(router_policies=["my_routes:nonsense"]))
    with pytest.raises(ValueError, match="cannot import"):
        rule(router_policies=["my_routes:missing"])


def test_router_configuration_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="router_backends is empty"):
        ServiceConfig(engine="router")
    with pytest.raises(ValueError, match=r"router_backends\['cluster'\]: InferApp.upstream_url"):
        ServiceConfig(engine="router", router_backends={"cluster": {"engine": "openai"}})
    with pytest.raises(ValueError, match="router_fallback"):
        ServiceConfig(engine="router", router_backends=BACKENDS, router_fallback={"cluster": "moon"})
    with pytest.raises(ValueError, match="not a regular expression"):
        ServiceConfig(engine="router", router_backends=BACKENDS, router_sensitive_patterns=["(unclosed"])
