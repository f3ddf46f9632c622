"""How a service's loop is made (``loops/loop_factory.py``)."""

from __future__ import annotations

import pytest

from jupyter_infer.loops import loop_factory
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.events import EventBus
from jupyter_infer.values.metrics import MetricsCollector


def test_a_loop_that_loads_a_model_shares_one_heap_and_the_simulated_one_leaves_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(loop_factory, "share_one_heap", lambda: calls.append(True) or True)
    loop_factory.make_loop(ServiceConfig(engine="simulated"), MetricsCollector(), EventBus())
    assert calls == []
    loop_factory.make_loop(ServiceConfig(engine="hf", model="unused"), MetricsCollector(), EventBus())
    assert calls == [True]  # before its thread starts: make_loop does not start it
