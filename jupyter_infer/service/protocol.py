"""``Service``: what the handlers, the embedded client, the bench, the demo and loadgen call.

One protocol for one engine (``InferenceService``, local or upstream) and for a router over
several (``RouterService``). A caller holds a ``RequestStream`` per request and needs nothing
from the scheduler or the engine behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..values.engine_info import EngineInfo
    from ..values.events import EventBus, Subscription
    from ..values.limits import Limits
    from ..values.metrics import MetricsCollector
    from ..values.request import Request
    from ..values.stream import RequestStream


class Service(Protocol):
    limits: Limits
    collector: MetricsCollector  # the records and aggregates (Prometheus listens to them)
    events: EventBus

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start loading the engine in the background (on the running event loop); idempotent."""

    async def stop(self, reason: str = ...) -> None:
        """Stop; every queued or running request ends with an error."""

    @property
    def started(self) -> bool: ...

    @property
    def state(self) -> str:
        """``stopped`` | ``loading`` | ``ready`` | ``failed`` | ``unreachable``."""

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo: ...

    @property
    def info(self) -> EngineInfo | None: ...

    # -- requests ---------------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Check ``request`` and queue it; ``InvalidRequest``, ``QueueFull`` or
        ``EngineUnavailable`` queue nothing. ``request`` is not changed."""

    def cancel(self, request_id: str) -> bool: ...

    def knows(self, request_id: str) -> bool: ...

    def reject(self, reason: str, *, outcome: str = "rejected") -> None:
        """Count a request refused before it reached the service (e.g. a bad body)."""

    # -- the tokenizer ----------------------------------------------------------------------
    async def tokenize(self, text: str) -> list[int]: ...

    async def render_chat(self, request: Request) -> str: ...

    async def detokenize(self, token_ids: list[int]) -> str: ...

    def token_texts(self, token_ids: list[int]) -> list[str]: ...

    # -- views ------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def prefix_cache(self) -> dict[str, Any] | None: ...

    def kv_cache(self) -> dict[str, Any] | None: ...

    def subscribe(self) -> Subscription: ...

    def status(self) -> dict[str, Any]: ...

    def metrics(self) -> dict[str, Any]: ...

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]: ...
