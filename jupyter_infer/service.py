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
        self.metrics = _CallableMetrics(keep=self.keep_records)  # SHIM (wip/client): service.metrics()
        self.events = EventBus()
        self.scheduler = Scheduler(
            lambda: load_engine(self.engine_config), self.scheduler_config, self.metrics, self.events
        )
        self.metrics.snapshot_of = self.scheduler.snapshot  # SHIM (wip/client)

    def start(self) -> None:
        """Start loading the engine in the background; requests wait until it is ready."""
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """What ``GET infer/batches`` answers: recent batch and request records, and who is
        running or waiting now; enough to draw a timeline of a past run."""
        scheduler = self.scheduler
        requests = 200 if requests is None else requests  # SHIM (wip/client): the server's default
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

    # -- SHIM (wip/client): the request-level seam the client codes against. The lead's
    # InferenceService on main provides these for real; at merge, main's version wins. ------
    @property
    def limits(self) -> SchedulerConfig:
        return self.scheduler_config

    @property
    def state(self) -> str:
        return self.scheduler.state

    async def wait_ready(self, timeout: float | None = None) -> Any:
        return await self.scheduler.wait_ready(timeout)

    async def submit(self, request: Any) -> Any:
        return await self.scheduler.submit(request)

    def cancel(self, request_id: str) -> bool:
        return self.scheduler.cancel(request_id)


class _CallableMetrics(MetricsCollector):
    """SHIM (wip/client): ``service.metrics()`` answers the infer/metrics JSON while
    ``service.metrics`` stays the collector the server uses; main's service replaces this."""

    snapshot_of: Any = None

    def __call__(self) -> dict[str, Any]:
        return self.snapshot_of()
