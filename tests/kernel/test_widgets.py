"""Widget state without a browser: timeline rows, the summary, the panel after a run.

The timeline's drawing code (TypeScript, shared with the lab panel) is tested in
``labextension/test/`` (tests/kernel/test_labextension.py runs those tests).
"""

from __future__ import annotations

import asyncio
import gc
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pytest

from jupyter_infer import Client
from jupyter_infer.kernel.widgets import (
    BatchTimeline,
    InferPanel,
    RunSummary,
    RunView,
    percentile,
    timeline_data,
)
from jupyter_infer.kernel.widgets import panel as panel_module
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig

STATIC = Path(__file__).resolve().parents[2] / "jupyter_infer" / "kernel" / "widgets" / "static"

# A past run as infer/batches returns it: a joins b's running batch (continuous mode).
PAYLOAD = {
    "batches": [
        {"id": 1, "mode": "continuous", "members": ["a"], "started_at": 100.00, "ended_at": 100.10,
         "steps": 4, "tokens": 4, "size": 1},
        {"id": 2, "mode": "continuous", "members": ["a", "b"], "started_at": 100.10, "ended_at": 100.30,
         "steps": 8, "tokens": 16, "size": 2},
        {"id": 3, "mode": "continuous", "members": ["b"], "started_at": 100.30, "ended_at": 100.40,
         "steps": 4, "tokens": 4, "size": 1},
        {"id": 4, "mode": "continuous", "members": ["z"], "started_at": 90.0, "ended_at": 91.0,
         "steps": 3, "tokens": 3, "size": 1},
    ],
    "requests": [
        {"id": "a", "queued_at": 99.99, "admitted_at": 100.0, "first_token_at": 100.02, "finished_at": 100.30,
         "batch_ids": [1, 2], "outcome": "ok", "completion_tokens": 12},
        {"id": "b", "queued_at": 100.05, "admitted_at": 100.10, "first_token_at": 100.12, "finished_at": 100.40,
         "batch_ids": [2, 3], "outcome": "ok", "completion_tokens": 12},
    ],
}


@pytest.fixture
def client() -> Iterator[Client]:
    engine = ServiceConfig(engine="simulated", simulated_token_delay_ms=(2.0, 4.0))
    client = Client(embedded=InferenceService(engine))
    yield client
    client.close()


def test_timeline_data_picks_the_runs_requests_and_their_batches() -> None:
    rows, batches = timeline_data(PAYLOAD, ["b", "a"], labels={"a": "first"})
    assert [r["id"] for r in rows] == ["b", "a"] and rows[1]["label"] == "first"
    assert [b["id"] for b in batches] == [1, 2, 3]  # batch 4 holds none of them
    assert rows[0]["batch_ids"] == [2, 3] and rows[0]["admitted_at"] == 100.10


def test_timeline_data_labels_another_users_row_and_keeps_when_it_was_parked() -> None:
    anonymous = {"id": "anon-0123", "owner": "another user", "anonymous": True, "queued_at": 100.0,
                 "first_token_at": 100.1, "batch_ids": [2], "outcome": "ok", "parked_at": [100.2],
                 "resumed_at": [100.25]}
    payload = {**PAYLOAD, "requests": [*PAYLOAD["requests"], anonymous]}
    rows, _ = timeline_data(payload, ["a", "anon-0123"])
    assert rows[0]["label"] == "a" and rows[1]["label"] == "another user"
    assert rows[1]["parked_at"] == [100.2] and rows[1]["resumed_at"] == [100.25]


def test_timeline_data_from_batch_records_alone() -> None:
    """A server that keeps batch records only: admission and the end come from the batches."""
    rows, _ = timeline_data(PAYLOAD["batches"], ["a", "b"],
                            observed={"a": {"queued_at": 99.9, "outcome": "ok", "tokens": 12}})
    a, b = rows
    assert (a["queued_at"], a["admitted_at"], a["finished_at"], a["batch_ids"]) == (99.9, 100.0, 100.3, [1, 2])
    assert b["outcome"] == "running" and b["finished_at"] is None  # nothing says it is done


def test_summary_numbers() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 50) is None
    rows, batches = timeline_data(PAYLOAD, ["a", "b"])
    summary = RunSummary.from_timeline(rows, batches)
    assert (summary.requests, summary.ok, summary.tokens, summary.batches) == (2, 2, 24, 3)
    assert summary.ttft_p50_ms == pytest.approx(50.0)  # 30 ms and 70 ms
    assert summary.batch_size_histogram == {1: 8, 2: 8}
    assert summary.mean_batch_size == 1.5
    assert summary.tokens_per_s == pytest.approx(24 / 0.41, rel=0.01)
    assert "TTFT p50 50 ms" in str(summary) and "steps by batch size" in summary.to_html()


SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}


def test_timeline_data_and_summary_carry_constraints() -> None:
    payload = {
        "batches": [{**PAYLOAD["batches"][1], "forced_tokens": 6}],
        "requests": [{**PAYLOAD["requests"][0], "constraint": "json_schema", "forced_tokens": 6},
                     {**PAYLOAD["requests"][1], "constraint": None, "forced_tokens": 0}],
    }
    rows, batches = timeline_data(payload, ["a", "b"])
    assert [(r["constraint"], r["forced_tokens"]) for r in rows] == [("json_schema", 6), (None, 0)]
    assert batches[0]["forced_tokens"] == 6
    summary = RunSummary.from_timeline(rows, batches)
    assert (summary.constrained, summary.constraint_kinds, summary.forced_tokens) == (1, {"json_schema": 1}, 6)
    assert summary.forced_share == 0.25  # 6 of 24 tokens
    assert "1 constrained (1 JSON schema), 6 of 24 tokens fast-forwarded (25%)" in str(summary)
    assert "fast-forwarded" in summary.to_html() and "25%" in summary.to_html()
    # A run with nothing constrained says nothing of it.
    plain = RunSummary.from_timeline(*timeline_data(PAYLOAD, ["a", "b"]))
    assert plain.constrained == 0 and "constrained" not in str(plain) + plain.to_html()


def test_constrained_requests_in_the_timeline_and_summary(client: Client) -> None:
    """Through the real service: a JSON-schema request, a choice and a free one."""
    schema = client.generate("x", json_schema=SCHEMA)
    choice = client.generate("Is a KV cache useful?", choice=["yes", "no"])
    free = client.generate("What is a KV cache?", max_tokens=12)
    view = RunView()
    for key, result in (("#1", schema), ("#2", choice), ("#3", free)):
        view.record_completion(key, result)
    view.refresh(client)
    rows = {r["id"]: r for r in view.timeline.requests}
    assert rows[schema.id]["constraint"] == "json_schema" and rows[choice.id]["constraint"] == "choice"
    assert rows[free.id]["constraint"] is None and rows[free.id]["forced_tokens"] == 0
    forced = rows[schema.id]["forced_tokens"] + rows[choice.id]["forced_tokens"]
    assert 0 < rows[schema.id]["forced_tokens"] <= rows[schema.id]["tokens"]
    assert sum(b["forced_tokens"] for b in view.timeline.batches) == forced
    summary = view.summary
    assert (summary.constrained, summary.forced_tokens) == (2, forced)
    assert summary.forced_share == round(forced / summary.tokens, 3)
    assert "2 constrained (1 JSON schema, 1 choice)" in view.text
    assert f"{forced} of {summary.tokens} tokens fast-forwarded" in view.text
    assert ">constrained<" in view.summary_html.value and ">fast-forwarded<" in view.summary_html.value


def test_timeline_widget_from_a_past_run() -> None:
    widget = BatchTimeline.from_batches(PAYLOAD, title="past")
    assert widget.request_ids == ["a", "b"] and widget.batch_ids == [1, 2, 3]
    state = widget.get_state()
    assert state["title"] == "past" and len(state["requests"]) == 2
    esm = (STATIC / "timeline.js").read_text()
    # One self-contained ES module (the renderer the lab panel uses; its tests are in
    # labextension/test/): a default export, nothing fetched from a CDN.
    assert "as default" in esm and "https://" not in esm and not re.search(r"^import ", esm, re.M)


def test_timeline_after_a_burst(client: Client) -> None:
    results = client.burst([f"What is the KV cache? {i}" for i in range(6)], max_tokens=10)
    widget = BatchTimeline.from_client(client, ids=[r.id for r in results])
    assert widget.request_ids == [r.id for r in results]
    for row, result in zip(widget.requests, results, strict=True):
        assert result.batch_id in row["batch_ids"] and row["tokens"] == 10 and row["outcome"] == "ok"
        assert row["queued_at"] <= row["admitted_at"] <= row["first_token_at"] <= row["finished_at"]
    assert {b for r in widget.requests for b in r["batch_ids"]} == set(widget.batch_ids)


@pytest.mark.asyncio
async def test_panel_run(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    panel = InferPanel(client)
    panel.fill(5)
    panel.add_prompt("What is a mixture of experts?")
    panel.remove_prompt(0)
    assert len(panel.prompts) == 5 and panel.prompts[-1] == "What is a mixture of experts?"
    panel.max_tokens.value = 16
    redraws = []
    monkeypatch.setattr(panel_module, "REDRAW_S", 0.05)
    panel.timeline.observe(lambda change: redraws.append(change), names="requests")
    await panel.send()
    assert len(panel.outputs.children) == 5
    assert all("done" in out.value and len(out.value) > 200 for out in panel.outputs.children)
    rows = panel.timeline.requests
    assert len(rows) == 5 and all(r["id"].startswith("req-") and r["batch_ids"] for r in rows)
    assert rows[0]["label"].startswith("#1 ")
    assert panel.run_view.summary.ok == 5 and panel.run_view.summary.tokens == 80
    assert "mean batch size" in panel.run_view.summary_html.value
    assert len(redraws) < 80  # throttled: not one redraw per token (5 × 16 tokens)
    assert not panel.running and not panel.send_button.disabled


@pytest.mark.asyncio
async def test_panel_run_with_constrained_answers(client: Client) -> None:
    """"answer as" JSON schema: every answer fits it, the summary counts them constrained."""
    panel = InferPanel(client, prompts=["What is RAG?", "What is attention?", "What is a KV cache?"])
    panel.max_tokens.value = 40
    panel.answer_format.label = "JSON schema {answer, confidence}"
    await panel.send()
    assert panel._states == ["done"] * 3
    rows = panel.timeline.requests
    assert {r["constraint"] for r in rows} == {"json_schema"} and all(r["forced_tokens"] > 0 for r in rows)
    summary = panel.run_view.summary
    assert summary.constrained == 3 and 0 < summary.forced_share < 1
    assert "constrained" in panel.run_view.summary_html.value


@pytest.mark.asyncio
async def test_panel_cancel() -> None:
    slow = ServiceConfig(engine="simulated", simulated_token_delay_ms=(10.0, 20.0))  # answers outlast the test
    client = Client(embedded=InferenceService(slow))
    panel = InferPanel(client, prompts=["Explain batching at length"] * 3)
    panel.max_tokens.value = 400
    task = panel.send()
    assert panel.send() is task  # one run at a time
    for _ in range(100):
        await asyncio.sleep(0.02)
        if all(state == "streaming" for state in panel._states):
            break
    panel.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0.1)
    assert client.metrics()["requests"]["cancelled"] == 3
    assert {r["outcome"] for r in panel.timeline.requests} == {"cancelled"}
    assert all("cancelled" in out.value for out in panel.outputs.children)
    await client.__aexit__()


async def _until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Let the kernel's loop run until ``condition()`` holds (the panel's tasks run on it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: still not true after {timeout:.0f} s"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_prompts_cross_cancels_its_request_and_the_run_goes_on() -> None:
    client = Client(embedded=InferenceService(ServiceConfig(engine="simulated", simulated_token_delay_ms=(4.0, 8.0))))
    panel = InferPanel(client, prompts=["What is RAG?", "Explain batching at length", "What is attention?"])
    panel.max_tokens.value = 120
    task = panel.send()
    await _until(lambda: panel._states == ["streaming"] * 3, "every request streams")
    rows = panel._prompt_rows.children
    assert [row.children[0].value for row in rows] == ["#1", "#2", "#3"]  # numbered as the answers
    cross = rows[1].children[2]
    assert cross.tooltip == "cancel request #2"
    cross.click()
    await task
    assert len(panel.prompts) == 3  # the prompt stays; its request stopped
    assert panel._states == ["done", "cancelled", "done"]
    assert 'data-state="cancelled"' in panel.outputs.children[1].value.replace("'", '"')
    assert [r["outcome"] for r in panel.timeline.requests] == ["ok", "cancelled", "ok"]
    summary = panel.run_view.summary
    assert (summary.ok, summary.cancelled) == (2, 1)
    await _until(lambda: client.metrics()["requests"]["cancelled"] == 1, "the server counts the cancel")
    assert client.metrics()["requests"]["ok"] == 2
    assert panel.timeline.requests[1]["tokens"] < 120
    # Once the run is over, the ✕ removes the prompt again.
    assert cross.tooltip == "remove this prompt"
    cross.click()
    assert panel.prompts == ["What is RAG?", "What is attention?"]
    await client.aclose()


class _Bug:
    """A stream that fails with an exception that is not an ``InferError`` (a bug somewhere)."""

    id = None
    text = ""
    tokens = 0

    def __aiter__(self) -> _Bug:
        return self

    async def __anext__(self) -> str:
        raise RuntimeError("a bug in a backend")


class _OneBuggyStream:
    """A client whose stream for prompts with "bug" in them fails."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def astream(self, prompt: str, **params: Any) -> Any:
        return _Bug() if "bug" in prompt else self._client.astream(prompt, **params)

    async def abatches(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._client.abatches(*args, **kwargs)


@pytest.mark.asyncio
async def test_a_failing_request_ends_alone_and_no_task_exception_goes_unretrieved(client: Client) -> None:
    """Runs started as a click starts them (nobody awaits the task): one request fails with
    a bug; the others finish, the failure shows on its row, and nothing is left for asyncio to
    log as "Task exception was never retrieved" in a later cell."""
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    panel = InferPanel(_OneBuggyStream(client), prompts=["What is RAG?", "a bug", "What is attention?"])
    panel.max_tokens.value = 8
    for _ in range(2):  # a second Send drops the first run's task
        panel.send()
        await _until(lambda: not panel.running, "the run ends")
        assert panel._states[0] == panel._states[2] == "done"
        assert panel._states[1] == "error: a bug in a backend"
        assert "error: a bug in a backend" in panel.outputs.children[1].value
        assert panel.status.value.startswith("finished: 2/3 done, 1 failed")
    gc.collect()
    await asyncio.sleep(0)
    assert not unretrieved, unretrieved


@pytest.mark.asyncio
async def test_answers_are_compact_and_open_to_their_whole_text(client: Client) -> None:
    panel = InferPanel(client)
    assert panel.answers.layout.display == "none"  # no answers yet
    panel.fill(8)
    panel.max_tokens.value = 40
    await panel.send()
    assert panel.answers.layout.display is None and panel.answers.selected_index == 0
    assert panel.answers.get_title(0) == "Answers (8/8 done)"
    for out in panel.outputs.children:
        # Two clamped lines, and the whole answer in a <details> a click opens.
        assert "<details>" in out.value and "ji-answer-preview" in out.value
    # The controls wrap on narrow screens instead of being clipped.
    assert all(row.layout.width == "100%" and "ji-wrap" in row._dom_classes
               for row in panel.children if isinstance(row, widgets.HBox))


def test_a_stale_live_record_does_not_undo_what_the_client_saw() -> None:
    """The server's records are fetched once a second: one that still says "queued" must not
    make a streaming row look queued (the timeline would draw it queued up to now)."""
    stale = {"batches": [], "requests": [{"id": "a", "queued_at": 100.0, "admitted_at": None,
                                          "first_token_at": None, "finished_at": None, "outcome": "queued"}]}
    seen = {"a": {"queued_at": 100.001, "first_token_at": 100.04, "outcome": "running"}}
    (row,), _ = timeline_data(stale, ["a"], observed=seen)
    assert row["outcome"] == "running" and row["first_token_at"] == 100.04
    seen["a"].update(finished_at=100.5, outcome="cancelled")
    (row,), _ = timeline_data(stale, ["a"], observed=seen)
    assert row["outcome"] == "cancelled"
    ended = {"requests": [{**stale["requests"][0], "outcome": "ok", "finished_at": 100.6}]}
    (row,), _ = timeline_data(ended, ["a"], observed=seen)
    assert row["outcome"] == "ok"  # the server's word on a finished request


def test_a_mid_run_summary_says_what_it_covers() -> None:
    rows = [
        {"id": "a", "queued_at": 100.0, "first_token_at": 100.04, "finished_at": 100.5, "outcome": "ok", "tokens": 8},
        {"id": "b", "queued_at": 100.0, "first_token_at": 100.05, "finished_at": None, "outcome": "running", "tokens": 5},
        {"id": "c", "queued_at": 100.0, "first_token_at": None, "finished_at": None, "outcome": "running"},
        {"id": "d", "queued_at": None, "first_token_at": None, "finished_at": None, "outcome": None},
    ]
    summary = RunSummary.from_timeline(rows, [], now=101.0)
    assert (summary.running, summary.ttft_known, summary.latency_known) == (3, 2, 1)
    # Tokens so far (8 done, 5 streaming) over the time so far, not over the first finish.
    assert (summary.tokens, summary.wall_s, summary.tokens_per_s) == (13, 1.0, 13.0)
    assert summary.ttft_p95_ms == pytest.approx(50, abs=0.5)  # from the two first tokens known
    text = str(summary)
    assert "1 ok, 0 failed, 0 cancelled, 3 running" in text
    assert "p95 50 ms (2 of 4)" in text and "p95 500 ms (1 of 4)" in text
    assert "(2 of 4)" in summary.to_html() and "3 running" in summary.to_html()
