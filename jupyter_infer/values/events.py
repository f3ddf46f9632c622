"""Live scheduler events (queued, admitted, token, finished, step, batch) for the panels.

Publishing costs the same whatever the number of subscribers: an event is appended once to
one shared log of the last ``capacity`` events, and subscribers read it at their own pace
through a cursor. Readers are woken at most once per flush interval (one timer for all),
so a panel gets each step's events in one write instead of one per token; the interval grows
with the number of readers (``flush_interval_s``, or 1 ms per reader if longer), so that
waking them all takes a bounded share of the event loop however many there are, and they
are woken a slice at a time, so that a step of the engine or Jupyter's own requests wait for
one slice at most, never for all of them. A reader that
falls more than ``capacity`` events behind loses the oldest ones: it is told how many (a
``dropped`` event), the bus counts them, and nothing is kept for it meanwhile.
``EventBus.render(entries, render)`` turns what readers take into wire text once for all the
readers that take the same span (those woken by the same tick), and ``coalesce_tokens``
lets a writer send a request's tokens since its last write as one event.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import TooManySubscribers

Event = dict[str, Any]
WAKE_PER_READER_S = 0.001  # a reader's wake-up and write cost ~0.1 ms: at most ~10 % of the loop
WAKE_SLICE = 32  # readers woken per turn of the event loop


class _Entry:
    __slots__ = ("seq", "event")

    def __init__(self, seq: int, event: Event) -> None:
        self.seq = seq
        self.event = event


class Subscription:
    """One reader's place in the bus's log. ``take()`` what came since; ``wait()`` for more."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._cursor = bus._next_seq
        self._waiter: asyncio.Future[None] | None = None
        self._pending: deque[Event] = deque()  # for get(): taken, not yet handed out
        self.closed = False
        self.dropped = 0

    def take(self) -> tuple[list[_Entry], int]:
        """The entries published since the last take, and how many were lost before them."""
        bus = self._bus
        log = bus._log
        first = log[0].seq if log else bus._next_seq
        lost = max(0, first - self._cursor)
        start = max(self._cursor, first) - first
        entries = list(itertools.islice(log, start, None))
        self._cursor = bus._next_seq
        if lost:
            self.dropped += lost
            bus.note_dropped(lost)
        return entries, lost

    @property
    def ready(self) -> bool:
        return self.closed or self._cursor < self._bus._next_seq

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) until there is something to take or the subscription
        is closed; True if there is."""
        if not self.ready:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            self._bus._waiting.add(self)
            timer = None if timeout is None else loop.call_later(timeout, _wake, self._waiter)
            try:
                await self._waiter
            finally:
                if timer is not None:
                    timer.cancel()
                self._bus._waiting.discard(self)
                self._waiter = None
        return self.ready and not self.closed

    async def get(self, timeout: float | None = None) -> Event | None:
        """The next event (in-process readers), ``None`` after ``timeout`` s or once closed.
        A loss shows as a ``{"type": "dropped", "count": n}`` event in its place."""
        if not self._pending:
            if not self.ready:
                await self.wait(timeout)
            entries, lost = self.take()
            if lost:
                self._pending.append({"type": "dropped", "count": lost})
            self._pending.extend(entry.event for entry in entries)
        return self._pending.popleft() if self._pending else None

    def close(self) -> None:
        """Leave the bus; a reader waiting in ``wait()`` returns at once."""
        self.closed = True
        self._bus._subscribers.discard(self)
        if not self._bus._subscribers:
            self._bus._log.clear()  # nobody reads: keep nothing
        if self._waiter is not None:
            _wake(self._waiter)


class EventBus:
    """Fan-out of live events to at most ``max_subscribers`` readers, through one shared log.

    ``publish`` must be called on the event loop's thread (the scheduler's loop).
    """

    def __init__(self, capacity: int = 2048, max_subscribers: int = 64, flush_interval_s: float = 0.05) -> None:
        self.capacity = capacity
        self.max_subscribers = max_subscribers
        self.flush_interval_s = flush_interval_s
        self._log: deque[_Entry] = deque(maxlen=capacity)
        self._next_seq = 0
        self._subscribers: set[Subscription] = set()
        self._waiting: set[Subscription] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.dropped = 0  # events subscribers lost by falling behind
        self.refused = 0  # subscriptions refused over max_subscribers
        self.on_dropped: list[Callable[[int], None]] = []
        self._rendered: dict[tuple[int, int, Callable], str] = {}  # the last few spans' text

    def __len__(self) -> int:
        return len(self._subscribers)

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self) -> Subscription:
        """A new reader, from the next event on; ``TooManySubscribers`` (429) over the cap."""
        if len(self._subscribers) >= self.max_subscribers:
            self.refused += 1
            raise TooManySubscribers(
                f"This server already has {len(self._subscribers)} live event subscribers, its "
                f"limit (InferApp.max_event_subscribers). Close another panel, or try again later.",
                retry_after=5.0,
            )
        sub = Subscription(self)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: Event) -> None:
        if not self._subscribers:
            return
        self._log.append(_Entry(self._next_seq, event))
        self._next_seq += 1
        if self._waiting and self._timer is None:
            interval = max(self.flush_interval_s, WAKE_PER_READER_S * len(self._subscribers))
            self._timer = asyncio.get_running_loop().call_later(interval, self._wake_all)

    def flush(self) -> None:
        """Wake every waiting reader now (e.g. after the last event, at shutdown)."""
        self._wake_all()

    def render(self, entries: list[_Entry], render: Callable[[list[Event]], str]) -> str:
        """``render`` of the events of ``entries``, computed once for every reader that takes
        the same span of the log."""
        if not entries:
            return ""
        key = (entries[0].seq, entries[-1].seq, render)
        text = self._rendered.get(key)
        if text is None:
            text = self._rendered[key] = render([entry.event for entry in entries])
            if len(self._rendered) > 8:  # readers far behind take spans of their own
                del self._rendered[next(iter(self._rendered))]
        return text

    def note_dropped(self, count: int) -> None:
        self.dropped += count
        for listener in self.on_dropped:
            listener(count)

    def stats(self) -> dict[str, int]:
        return {"subscribers": len(self._subscribers), "dropped": self.dropped, "refused": self.refused}

    def _wake_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._wake_slices(list(self._waiting))

    def _wake_slices(self, readers: list[Subscription]) -> None:
        for sub in readers[:WAKE_SLICE]:
            if sub._waiter is not None:
                _wake(sub._waiter)
        if len(readers) > WAKE_SLICE:  # the rest on a later turn, after whatever else is ready
            asyncio.get_running_loop().call_soon(self._wake_slices, readers[WAKE_SLICE:])


def coalesce_tokens(events: list[Event]) -> list[Event]:
    """``events`` with each request's ``token`` events merged into one, where its first was:
    the texts joined, ``index`` the last. A panel counts tokens by index and needs no more;
    500 panels watching a fast batch would otherwise be sent every token one by one."""
    out: list[Event] = []
    merged: dict[Any, tuple[Event, list[str]]] = {}
    for event in events:
        if event.get("type") != "token":
            out.append(event)
            continue
        seen = merged.get(event.get("id"))
        if seen is None:
            seen = merged[event.get("id")] = (dict(event), [])
            out.append(seen[0])
        seen[1].append(event.get("text", ""))
        seen[0]["index"] = event.get("index")
    for token, texts in merged.values():
        token["text"] = "".join(texts)
    return out


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
