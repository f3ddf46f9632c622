"""Every notebook runs top to bottom with nbclient, in a real kernel, against a real Jupyter
server with the extension (simulated engine, short token delays); then its outputs are
checked: streamed text, the timeline widgets' state, no errors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_infer.kernel.launcher import LocalServer

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
pytestmark = pytest.mark.slow
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer(engine="simulated", simulated_token_delay_ms=[2.0, 6.0]) as running:
        yield running


def execute(name: str, server: LocalServer, tmp_path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    env = {**os.environ, "JUPYTER_INFER_URL": server.url, "JUPYTER_INFER_TOKEN": server.token,
           "HF_HUB_OFFLINE": "1"}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    return nb


def outputs(nb: nbformat.NotebookNode) -> list[tuple[int, dict[str, Any]]]:
    return [(i, out) for i, cell in enumerate(nb.cells) if cell.cell_type == "code" for out in cell.outputs]


def text_of(nb: nbformat.NotebookNode, index: int) -> str:
    parts = []
    for out in nb.cells[index].outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
    return "".join(parts)


def cell_index(nb: nbformat.NotebookNode, snippet: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and snippet in c.source)


def widget_states(nb: nbformat.NotebookNode) -> dict[str, dict[str, Any]]:
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return {model_id: model["state"] for model_id, model in state.items()}


def timelines(nb: nbformat.NotebookNode) -> list[dict[str, Any]]:
    return [s for s in widget_states(nb).values()
            if s.get("_anywidget_id", "").endswith("BatchTimeline") and s.get("requests")]


def assert_clean(nb: nbformat.NotebookNode) -> None:
    """No error and nothing on stderr (a person sees stderr as a red box)."""
    errors = [(i, out) for i, out in outputs(nb) if out.output_type == "error"]
    assert not errors, json.dumps(errors, default=str)[:3000]
    stderr = [(i, out.text) for i, out in outputs(nb) if out.output_type == "stream" and out.name == "stderr"]
    assert not stderr, stderr


def assert_timeline_consistent(state: dict[str, Any]) -> None:
    """Every row's batches are in the batch list, and every batch holds one of the rows."""
    ids = {r["id"] for r in state["requests"]}
    batch_ids = {b["id"] for b in state["batches"]}
    for row in state["requests"]:
        assert row["id"].startswith("req-"), row
        assert row["batch_ids"], row
        assert set(row["batch_ids"]) <= batch_ids, row
        assert row["queued_at"] and row["finished_at"] and row["finished_at"] >= row["queued_at"], row
        assert row["outcome"] == "ok", row
    for batch in state["batches"]:
        assert ids & set(batch["members"]), batch


def test_quickstart(server: LocalServer, tmp_path: Path) -> None:
    nb = execute("01_quickstart.ipynb", server, tmp_path)
    assert_clean(nb)
    status = text_of(nb, cell_index(nb, "%infer_status"))
    assert "simulated" in status and "found via environment" in status
    streamed = text_of(nb, cell_index(nb, "%%infer --max-tokens 48"))
    assert "batching" in streamed.lower() and "tokens · first token" in streamed
    # One display updated in place, not a line per token.
    displays = [o for o in nb.cells[cell_index(nb, "%%infer --max-tokens 48")].outputs if o.output_type == "display_data"]
    assert len(displays) == 1
    assert "batch #" in text_of(nb, cell_index(nb, "--no-stream"))
    assert "tokens, first after" in text_of(nb, cell_index(nb, "client.stream("))
    assert text_of(nb, cell_index(nb, "asyncio.gather")).count("batch #") == 4
    # The panel's run: 6 rows with server ids and batch ids, and its summary.
    states = timelines(nb)
    assert len(states) == 1 and len(states[0]["requests"]) == 6
    assert_timeline_consistent(states[0])
    assert "6 requests (6 ok" in text_of(nb, cell_index(nb, "await panel.send()"))
    panel_outputs = [s["value"] for s in widget_states(nb).values()
                     if s.get("_model_name") == "HTMLModel" and "<b>#" in s.get("value", "")]
    assert len(panel_outputs) == 6 and all("done" in v for v in panel_outputs)


def test_dynamic_batching(server: LocalServer, tmp_path: Path) -> None:
    nb = execute("02_dynamic_batching.ipynb", server, tmp_path)
    assert_clean(nb)
    summary = text_of(nb, cell_index(nb, "%infer_burst 12 --max-tokens 32"))
    assert "12 requests (12 ok" in summary
    states = timelines(nb)
    # two bursts, window, continuous, and the past-run timeline
    assert len(states) >= 5, [s.get("title") for s in states]
    bursts = [s for s in states if s.get("title", "").startswith("burst of 12")]
    assert len(bursts) == 2
    for state in bursts:
        assert len(state["requests"]) == 12
        assert_timeline_consistent(state)
    # All at once: most of the requests run in one batch.
    at_once = next(s for s in bursts if "all at once" in s["title"])
    assert max(b["size"] for b in at_once["batches"]) >= 8
    by_title = {s["title"]: s for s in states}
    window, continuous = by_title["window batching"], by_title["continuous batching"]
    assert {b["mode"] for b in window["batches"]} == {"window"}
    assert {b["mode"] for b in continuous["batches"]} == {"continuous"}
    assert_timeline_consistent(window)
    assert_timeline_consistent(continuous)
    assert "window:" in text_of(nb, cell_index(nb, "for mode in"))


def test_agents(server: LocalServer, tmp_path: Path) -> None:
    nb = execute("03_agents.ipynb", server, tmp_path)
    assert_clean(nb)
    report = text_of(nb, cell_index(nb, "run = await run_agents"))
    assert report.startswith("36 model calls by 6 agents"), report  # 6 agents × 2 rounds × (2 + 1)
    assert "batch #" in report
    (state,) = timelines(nb)
    assert len(state["requests"]) == 36
    assert {r["label"].split(" · ")[2] for r in state["requests"]} == {"reflect", "synthesize"}
    assert_timeline_consistent(state)
    assert max(b["size"] for b in state["batches"]) > 1  # agents' calls shared batches
    assert "faster" in text_of(nb, cell_index(nb, "print(savings)"))


def test_openai_client(server: LocalServer, tmp_path: Path) -> None:
    nb = execute("04_openai_client.ipynb", server, tmp_path)
    assert_clean(nb)
    assert "infer/v1" in text_of(nb, cell_index(nb, "base_url ="))
    assert text_of(nb, cell_index(nb, "oai.completions.create")).strip()
    assert text_of(nb, cell_index(nb, "stream=True")).strip()
    assert text_of(nb, cell_index(nb, "asyncio.gather")).count("…") == 4
    assert "'batch'" in text_of(nb, cell_index(nb, "infer/generate\","))
    sse = text_of(nb, cell_index(nb, "generate_stream"))
    assert "event: token" in sse and "data: [DONE]" in sse
