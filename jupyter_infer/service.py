"""One object that holds the engine, scheduler, metrics and events: what the server and the
embedded client share, and what handlers talk to."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .engine import EngineConfig, load_engine
from .events import EventBus
from .metrics import MetricsCollector
from .scheduler import Scheduler, SchedulerConfig


@dataclass
class InferenceService:
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    keep_records: int = 1000

    def __post_init__(self) -> None:
        self.metrics = MetricsCollector(keep=self.keep_records)
        self.events = EventBus()
        self.scheduler = Scheduler(
            lambda: load_engine(self.engine_config), self.scheduler_config, self.metrics, self.events
        )

    def start(self) -> None:
        """Start loading the engine in the background; requests wait until it is ready."""
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    def batches(self, limit: int = 50, requests: int = 200) -> dict[str, Any]:
        """What ``GET infer/batches`` answers: recent batch and request records, and who is
        running or waiting now; enough to draw a timeline of a past run."""
        scheduler = self.scheduler
        return {
            "batches": [b.to_json() for b in self.metrics.recent_batches(limit)],
            "requests": [r.to_json() for r in self.metrics.request_records(requests)],
            "running": [s.id for s in scheduler.running],
            "waiting": [s.id for s in scheduler.waiting],
            "mode": scheduler.config.mode,
            "now": round(time.time(), 6),
        }

    def status(self) -> dict[str, Any]:
        out = self.scheduler.status()
        out["configured"] = {"engine": self.engine_config.engine, "model": self.engine_config.model}
        return out
