"""Live scheduler events (queued, admitted, token, finished, step, batch) for the panels."""

from __future__ import annotations

import asyncio
from typing import Any


class Subscription:
    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)

    async def get(self, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        self._bus._subscribers.discard(self)


class EventBus:
    """Fan-out to subscribers' bounded queues; a slow subscriber loses events, never blocks.

    ``publish`` must be called on the event loop's thread (the scheduler's loop).
    """

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self, maxsize: int = 2000) -> Subscription:
        sub = Subscription(self, maxsize)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: dict[str, Any]) -> None:
        for sub in self._subscribers:
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                pass  # a subscriber that does not read loses events; nobody else waits
