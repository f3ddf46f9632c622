"""The loop a configuration runs: a local engine's (``EngineLoop``) or an upstream server's
(``UpstreamLoop``, ``engine = "openai"``). The one place that tells the kinds apart."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..cpu.process_memory import share_one_heap
from ..engine import load_engine
from ..scheduler import Recorder
from .engine_loop import EngineLoop

if TYPE_CHECKING:
    from ..engine import Engine
    from ..upstream.connection import UpstreamServer
    from ..values.config import ServiceConfig
    from ..values.events import EventBus
    from ..values.metrics import MetricsCollector
    from .request_loop import RequestLoop


def make_loop(
    cfg: ServiceConfig, collector: MetricsCollector, events: EventBus, *,
    engine_loader: Callable[[], Engine] | None = None, route: str | None = None,
    batch_ids: Iterator[int] | None = None, upstream: UpstreamServer | None = None,
) -> RequestLoop:
    """The loop for ``cfg.engine``, with a recorder feeding ``collector`` and ``events``.
    Behind a router (``route``) a request's model is not checked again: the rule matched it."""
    def recorder(source: str) -> Recorder:
        return Recorder(cfg.mode, collector, events, route=route, batch_ids=batch_ids, source=source)

    if cfg.engine == "openai":
        from .upstream_loop import UpstreamLoop

        return UpstreamLoop(cfg, recorder(UpstreamLoop.source), upstream, check_model=route is None)
    if engine_loader is None and cfg.engine != "simulated":
        share_one_heap()  # before the engine's thread starts (process_memory.py)
    return EngineLoop(engine_loader or (lambda: load_engine(cfg)), cfg, recorder(EngineLoop.source),
                      check_model=route is None)
