"""Loading you can watch: where the loader is, how far, how long, in status and the log, from
the first second; and a "ready" line that says what was loaded."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values import load_progress
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.load_progress import LoadProgress

pytestmark = pytest.mark.timeout(60)


def test_progress_counts_phases_and_estimates_what_is_left() -> None:
    now = [0.0]
    lines: list[str] = []
    progress = LoadProgress("m", log=lines.append, clock=lambda: now[0])
    progress.phase("reading the tokenizer")
    now[0] = 1.0
    progress.phase("reading the linears into int4", 100, "linears")
    now[0] = 11.0
    progress.advance(25)
    snap = progress.snapshot()
    assert (snap["phase"], snap["done"], snap["total"], snap["unit"]) == ("reading the linears into int4", 25, 100,
                                                                          "linears")
    assert snap["phase_left_s"] == 30.0 and snap["elapsed_s"] == 11.0
    assert snap["phases"] == [{"phase": "reading the tokenizer", "s": 1.0}]
    assert lines[-1] == "loading m: reading the linears into int4: 25 of 100 linears, about 30 s left [11.0 s]"
    assert load_progress.current().model == ""  # no one listens on this thread: a silent one
    now[0] = 53.5
    progress.finish()
    now[0] = 1102.3  # long after: the load took what it took (its clock had kept counting)
    snap = progress.snapshot()
    assert (snap["phase"], snap["elapsed_s"], snap["phase_s"], snap["phase_left_s"]) == ("done", 53.5, 52.5, None)
    assert snap["phases"][-1] == {"phase": "reading the linears into int4", "s": 52.5}


@pytest.mark.asyncio
async def test_status_shows_the_load_as_it_goes_and_the_log_says_ready(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jupyter_infer")
    halfway, go_on = threading.Event(), threading.Event()

    def load() -> SimulatedEngine:
        progress = load_progress.current()
        progress.phase("reading the linears into int4", 8, "linears")
        progress.advance(3)
        halfway.set()
        go_on.wait(10)
        return SimulatedEngine(seed=0, token_delay_ms=(0, 0))

    service = InferenceService(ServiceConfig(engine="simulated"), engine_loader=load)
    service.start()
    try:
        await asyncio.to_thread(halfway.wait, 10)
        status = service.status()
        assert status["state"] == "loading"
        loading = status["loading"]
        assert (loading["phase"], loading["done"], loading["total"]) == ("reading the linears into int4", 3, 8)
        go_on.set()
        await service.wait_ready()
        done = service.status()["loading"]
        assert done["phase"] == "done" and [p["phase"] for p in done["phases"]] == ["reading the linears into int4"]
        said = [r.getMessage() for r in caplog.records]
        assert any("loading the simulated engine: reading the linears into int4 (8 linears)" in m for m in said)
        assert any(m.startswith("jupyter_infer | ready: ") for m in said), said
    finally:
        go_on.set()
        await service.stop()
