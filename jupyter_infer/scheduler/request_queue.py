"""The requests a core holds, whatever runs them: the queue with its limits (``429``), who is
running and who is parked, when an idle core may start a burst, and every request's end.

Both cores keep their requests here: the engine's ``Scheduler`` (which decides steps) and
the upstream's ``UpstreamAdmission`` (which decides who may go upstream). Neither knows the
other; both hand the owners' fair order to ``fair.Owners``. Synchronous and free of I/O;
lifecycle facts go to the ``Recorder``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import QueueFull
from ..values.sequence import Sequence, Status
from .fair import Owners

if TYPE_CHECKING:
    from ..values.config import ServiceConfig
    from .recorder import Recorder


class RequestQueue:
    def __init__(self, config: ServiceConfig, recorder: Recorder) -> None:
        self.config = config
        self.recorder = recorder
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # admitted, in the order they joined
        self.parked: list[Sequence] = []  # admitted, sitting out while another owner has their place
        self.owners = Owners(config.fair_share, config.owner_max_running)
        self._live: dict[str, Sequence] = {}
        self._finished: list[Sequence] = []
        self._window_opened: float | None = None
        self._last_arrival = 0.0

    def add(self, seq: Sequence, now: float) -> None:
        """Queue ``seq``; raise ``QueueFull`` (queueing nothing) when the queue is full."""
        if len(self.waiting) >= self.config.max_queue_size:
            self.recorder.rejected("queue_full")
            raise QueueFull(
                f"The queue is full ({self.config.max_queue_size} waiting requests). Retry "
                "shortly, or raise InferApp.max_queue_size.", retry_after=1.0,
            )
        limit = self.config.owner_max_queued
        if limit and sum(s.request.owner == seq.request.owner for s in self.waiting) >= limit:
            self.recorder.rejected("owner_queue_full")
            raise QueueFull(
                f"You have {limit} requests waiting already (InferApp.owner_max_queued): wait for "
                "some to finish, then retry.", retry_after=1.0,
            )
        if not self.waiting:  # the first request into an empty queue opens the window
            self._window_opened = now
        self._last_arrival = now
        self.waiting.append(seq)
        self._live[seq.id] = seq
        self.recorder.queued(seq, len(self.waiting))

    def live(self, request_id: str) -> Sequence | None:
        """A queued, running or parked request."""
        return self._live.get(request_id)

    def owner_of(self, request_id: str) -> str | None:
        """Who sent a queued, running or parked request (``None``: no such live request)."""
        seq = self._live.get(request_id)
        return None if seq is None else seq.request.owner

    def idle_wait(self, now: float) -> float | None:
        """When an idle core may start what waits (``None``: now). It waits for the window
        (``window`` mode), or a few ms (``continuous``): a burst landing over some ms then
        starts together instead of in pieces."""
        cfg = self.config
        if self._window_opened is None:
            self._window_opened = now
        if cfg.mode == "window":
            deadline = self._window_opened + cfg.batch_window_ms / 1000
        else:
            quiet = cfg.idle_admit_delay_ms / 1000
            deadline = min(self._window_opened + 10 * quiet, self._last_arrival + quiet)
        return deadline if len(self.waiting) < cfg.batch_size and now < deadline else None

    def start(self, newcomers: list[Sequence], now: float) -> None:
        """``newcomers`` (waiting) run from now on."""
        admitted = set(map(id, newcomers))
        self.waiting = [s for s in self.waiting if id(s) not in admitted]
        # Leftovers of a window batch open the next window now.
        self._window_opened = now if self.waiting else None
        for seq in newcomers:
            seq.status = Status.RUNNING
        self.running.extend(newcomers)
        self.recorder.admitted(newcomers, self.running, now)

    def pick(self, room: int) -> list[Sequence]:
        """Up to ``room`` waiting requests in the owners' fair order (no budget, no parking:
        what a core without steps starts)."""
        self.owners.reset(self.running, (), self.waiting)
        picked: list[Sequence] = []
        while len(picked) < room and (seq := self.owners.next()) is not None:
            self.owners.take(seq)
            picked.append(seq)
        return picked

    def drop(self, seq: Sequence, now: float) -> None:
        """A queued or parked request is cancelled where it is."""
        (self.waiting if seq.status is Status.WAITING else self.parked).remove(seq)
        self.finish(seq, "cancelled", now)

    def abort(self, reason: str, now: float) -> None:
        """Every queued, running and parked request ends with ``reason`` (the service stops)."""
        for seq in self.waiting + self.running + self.parked:
            self.finish(seq, "failed", now, error=reason)
        self.waiting.clear()
        self.running.clear()
        self.parked.clear()
        self.recorder.left([], now)

    def retire(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        """A running request ends."""
        self.running.remove(seq)
        self.finish(seq, outcome, now, error)

    def finish(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        seq.status = Status.FINISHED
        rec = seq.record
        rec.outcome, rec.finished_at, rec.error = outcome, now, error
        if outcome == "cancelled":
            rec.finish_reason = "cancelled"
        del self._live[seq.id]
        self.recorder.finished(seq)
        self._finished.append(seq)

    def pop_finished(self) -> list[Sequence]:
        """The requests that ended since the last call (their loop ends their streams)."""
        finished, self._finished = self._finished, []
        return finished


class QueuedCore:
    """What both cores say of their queue (the engine's ``Scheduler`` and an upstream's
    ``UpstreamAdmission``): who waits, who runs, how a request joins and how it is cancelled.
    Each says what cancelling one that runs means (``_cancel_running``)."""

    queue: RequestQueue

    @property
    def waiting(self) -> list[Sequence]:
        return self.queue.waiting

    @property
    def running(self) -> list[Sequence]:
        """Admitted, in the order they joined: prefilling or decoding, or in flight upstream."""
        return self.queue.running

    def add(self, seq: Sequence, now: float) -> None:
        """Queue ``seq``; raise ``QueueFull`` (queueing nothing) when the queue is full."""
        self.queue.add(seq, now)

    def cancel(self, request_id: str, now: float) -> bool:
        """Cancel a request: a queued (or parked) one is dropped now, a running one as its core
        says; False when there is no such live request."""
        seq = self.queue.live(request_id)
        if seq is None:
            return False
        if seq.status is Status.RUNNING:
            self._cancel_running(seq, now)
        else:
            self.queue.drop(seq, now)
        return True

    def _cancel_running(self, seq: Sequence, now: float) -> None:
        raise NotImplementedError
