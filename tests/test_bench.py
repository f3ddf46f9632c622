"""``jupyter infer bench``: its pieces, and a ``--quick`` run end to end (no speed asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_infer.bench import workloads as wl
from jupyter_infer.bench.report import evaluate_targets, format_tables, format_targets
from jupyter_infer.cli import main

CONTENDERS = ("sequential", "static", "window", "continuous", "hf_cb", "ceiling")
LABELS = ("sequential generate", "static batch (padded generate)", "ours: window", "ours: continuous",
          "transformers continuous batching", "ceiling (bare decode steps)", "ours over HTTP+SSE")


def words(text: str) -> int:
    return len(text.split())


def test_workloads_match_the_issue() -> None:
    burst = wl.burst(words, 16, 32)
    assert burst.closed and len(burst.arrivals) == 16 and burst.total_tokens == 16 * 32
    assert all(18 <= words(a.prompt) <= 22 for a in burst.arrivals)
    mixed = wl.mixed(words, 32)
    assert [a.max_tokens for a in mixed.arrivals[:5]] == [8, 16, 32, 64, 8]
    open_ = wl.open_loop(words, 20, rate=4.0, seed=1)
    assert not open_.closed
    assert open_.arrivals == wl.open_loop(words, 20, rate=4.0, seed=1).arrivals


def _results(**medians: dict) -> dict:
    return {"workloads": {
        name: {"description": name, "contenders": {
            key: {"label": key, "median": m} for key, m in contenders.items()
        }} for name, contenders in medians.items()
    }}


def test_targets_are_ratios_within_the_run() -> None:
    results = _results(
        burst={"continuous": {"tokens_per_s": 95.0}, "ceiling": {"tokens_per_s": 100.0},
               "sequential": {"tokens_per_s": 20.0}},
        open={"continuous": {"ttft_p50_ms": 30.0}, "window": {"ttft_p50_ms": 100.0}},
    )
    by_text = {t["target"]: t for t in evaluate_targets(results)}
    ceiling = next(t for k, t in by_text.items() if "ceiling" in k)
    assert ceiling["ratio"] == pytest.approx(0.95) and ceiling["met"] is True
    sequential = next(t for k, t in by_text.items() if "sequential" in k)
    assert sequential["ratio"] == pytest.approx(4.75) and sequential["met"] is False
    ttft = next(t for k, t in by_text.items() if "TTFT" in k)
    assert ttft["ratio"] == pytest.approx(0.3) and ttft["met"] is False
    assert all(t["met"] is None for t in evaluate_targets(results) if t["workload"] in ("mixed", "http"))
    text = format_targets(results)
    assert "MISSED" in text and "met" in text and "n/a" in text
    assert "x seq" in format_tables(results)


@pytest.mark.slow
def test_bench_quick_runs_every_contender(tiny_model_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "bench"
    code = main(["bench", "--quick", "--model", str(tiny_model_dir), "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    for label in LABELS:
        assert label in out, label
    assert "Targets" in out
    results = json.loads((out_dir / "results.json").read_text())
    workloads = results["workloads"]
    assert set(CONTENDERS) <= set(workloads["burst"]["contenders"])
    assert set(CONTENDERS) <= set(workloads["mixed"]["contenders"])
    assert {"window", "continuous", "hf_cb"} <= set(workloads["open"]["contenders"])
    assert "http" in workloads["http"]["contenders"], workloads["http"]
    for name in ("burst", "mixed"):
        for key in CONTENDERS:
            median = workloads[name]["contenders"][key]["median"]
            assert median["tokens_per_s"] > 0, (name, key)
            if key != "ceiling":  # every contender generated exactly the tokens asked for
                assert median["tokens"] == workloads[name]["total_new_tokens"], (name, key)
    assert len(results["targets"]) == 6
    assert (out_dir / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
