"""Widget state without a browser: timeline rows, the summary, the panel after a run.

The timeline's drawing code (TypeScript, shared with the lab panel) is tested in
``labextension/test/`` (tests/test_labextension.py runs those tests).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_infer import Client
from jupyter_infer.config import ServiceConfig
from jupyter_infer.service import InferenceService
from jupyter_infer.widgets import BatchTimeline, InferPanel, RunSummary, percentile, timeline_data
from jupyter_infer.widgets import panel as panel_module

STATIC = Path(__file__).resolve().parent.parent / "jupyter_infer" / "widgets" / "static"

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
