"""Every notebook runs top to bottom with nbclient, in a real kernel, against a real Jupyter
server with the extension (simulated engine, short token delays); then its outputs are
checked: streamed text, the timeline widgets' state, no errors."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_infer.kernel.agents import Savings, compare_phrase
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
    assert_comparison_honest(text_of(nb, cell_index(nb, "print(savings)")))


COMPARISON = re.compile(r"([\d.]+) s batched vs ([\d.]+) s one at a time .*— batched was (.*)")


def assert_comparison_honest(text: str) -> None:
    """The printed comparison says "faster" only with a ratio ≥ 1 and a saving, "slower" only
    with a loss, and never a negative number of seconds."""
    match = COMPARISON.search(text)
    assert match, text
    batched, alone, verdict = float(match[1]), float(match[2]), match[3]
    assert not re.search(r"-\s*\d", verdict), text
    found = re.match(r"([\d.]+)× (faster|slower), ([\d.]+) s (saved|lost)", verdict)
    if found is None:
        assert verdict.startswith("about as fast"), text
        assert max(alone, batched) / min(alone, batched) < 1.07, text
        return
    ratio, word, gap, outcome = float(found[1]), found[2], float(found[3]), found[4]
    assert ratio > 1.0 and gap >= 0, text
    assert (word, outcome) == (("faster", "saved") if alone >= batched else ("slower", "lost")), text
    # the seconds are printed rounded to 0.01 s: a ratio of short times may differ a little
    assert ratio == pytest.approx(max(alone, batched) / min(alone, batched), rel=0.03, abs=0.06), text
    assert gap == pytest.approx(abs(alone - batched), abs=0.011), text
    assert ("did not pay here" in verdict) == (word == "slower"), text


def test_agents_comparison_is_phrased_the_way_it_came_out() -> None:
    """The user's run printed "0.4× faster, -21.75 s saved": a slower batched run must say so."""
    assert compare_phrase(10.0, 18.0) == "1.8× faster, 8.00 s saved"
    assert compare_phrase(36.25, 14.5) == "2.5× slower, 21.75 s lost"
    assert compare_phrase(10.0, 10.2) == "about as fast (within 5%)"
    assert compare_phrase(0.0, 3.0).startswith("nothing to compare")
    slower = Savings(calls=36, measured_calls=6, batched_s=36.25, one_at_a_time_s=14.5, tool_s=0.6,
                     mean_batch_size=10.0, longest_wait_s=29.0)
    faster = Savings(calls=36, measured_calls=6, batched_s=3.17, one_at_a_time_s=21.68, tool_s=0.6,
                     mean_batch_size=10.0, longest_wait_s=0.05)
    for savings in (slower, faster):
        assert_comparison_honest(str(savings))
        assert_comparison_honest(savings._repr_html_())
    assert "slower" in str(slower) and "faster" not in str(slower) and "queue" in str(slower)
    assert "faster, 18.51 s saved" in str(faster) and "did not pay" not in str(faster)
    # Each reason that a slower run names comes from what was measured.
    hardly = Savings(calls=6, measured_calls=6, batched_s=5.0, one_at_a_time_s=4.0, tool_s=0.0,
                     mean_batch_size=1.1)
    assert "hardly overlapped" in hardly.verdict()
    crowded = Savings(calls=36, measured_calls=6, batched_s=5.0, one_at_a_time_s=4.0, tool_s=0.0,
                      mean_batch_size=8.0, longest_wait_s=0.2)
    assert "step with many rows" in crowded.verdict()
    # The old phrasing fails the check.
    with pytest.raises(AssertionError):
        assert_comparison_honest("36 model calls, mean batch size 10.00: 36.25 s batched vs 14.50 s one at a "
                                 "time (measured) — batched was 0.4× faster, -21.75 s saved")


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
