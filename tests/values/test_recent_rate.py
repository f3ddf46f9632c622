"""The recent tokens/s that the status bar, the panel and %infer_status show falls to 0 once
nothing has run for 10 s (it kept the last burst's figure while idle)."""

from __future__ import annotations

import time

from jupyter_infer.values.metrics import MetricsCollector


def test_an_idle_servers_recent_rate_is_zero() -> None:
    collector = MetricsCollector()
    collector.started_at -= 60
    collector.step("decode", 4, 400, 1.0, time.monotonic() - 1)
    assert collector.snapshot()["recent_tokens_per_s"] > 0
    idle = MetricsCollector()
    idle.started_at -= 60
    idle.step("decode", 4, 400, 1.0, time.monotonic() - 20)
    assert idle.snapshot()["recent_tokens_per_s"] == 0
