"""One object that holds the engine, scheduler, metrics and events: what the server and the
embedded client share, and what handlers talk to."""

from __future__ import annotations

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

    def status(self) -> dict[str, Any]:
        out = self.scheduler.status()
        out["configured"] = {"engine": self.engine_config.engine, "model": self.engine_config.model}
        return out
