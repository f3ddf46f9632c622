"""Who may go to an upstream server now (``engine = "openai"``).

The same queue, owners' fair order, priorities, ``429`` and idle wait as the engine's core
(both keep their requests in a ``RequestQueue``; neither is the other): ``max_batch_size``
bounds the requests in flight upstream, the next to start is the owners' fair pick (highest
priority first within an owner), and an idle front waits ``idle_admit_delay_ms`` so that a
burst starts together. What differs is that there are
no steps: an admitted request runs upstream on its own, its text arrives chunk by chunk, and
it leaves (finished, failed, cancelled) the moment it ends. Synchronous and free of I/O, like
the engine's core; the ``UpstreamLoop`` does the HTTP.

Spans (the batch records of an upstream) change when requests start or leave. Requests that
the upstream finishes together (a burst with one ``max_tokens``) leave a millisecond apart,
each on its own chunk: their departures are recorded together, ``idle_admit_delay_ms`` after
the first (or at the next start), as an engine records every row that leaves in one step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scheduler.request_queue import QueuedCore, RequestQueue
from ..values.sequence import Sequence, Status

if TYPE_CHECKING:
    from ..scheduler import Recorder
    from ..values.config import ServiceConfig
    from .upstream_sequence import UpstreamSequence


class UpstreamAdmission(QueuedCore):
    def __init__(self, config: ServiceConfig, recorder: Recorder) -> None:
        self.config = config
        self.recorder = recorder
        self.queue = RequestQueue(config, recorder)  # the upstream pads and batches on its own
        self._left_at: float | None = None  # a departure not yet recorded in the spans

    def start(self, now: float) -> tuple[list[Sequence], float | None]:
        """The queued requests to send upstream now (they are running from here on), or
        ``([], wake_at)``: nothing to start before ``wake_at`` (``None``: until something
        arrives or leaves)."""
        newcomers, wake_at = self._admit(now)
        if newcomers:
            self._left_at = None  # admitted() opened a span of who runs now
        elif self._left_at is not None:
            due = self._left_at + self.config.idle_admit_delay_ms / 1000
            if now >= due:
                self._left_at = None
                self.recorder.left(self.running, now)
            else:
                wake_at = due if wake_at is None else min(wake_at, due)
        return newcomers, wake_at

    def _admit(self, now: float) -> tuple[list[Sequence], float | None]:
        """Requests start whenever there is room (they do not wait for each other's steps);
        an idle front waits ``idle_admit_delay_ms`` so that a burst starts together."""
        queue = self.queue
        if not queue.waiting:
            return [], None
        if not queue.running and (deadline := queue.idle_wait(now)) is not None:
            return [], deadline
        newcomers = queue.pick(self.config.batch_size - len(queue.running))
        if newcomers:
            queue.start(newcomers, now)
        return newcomers, None

    def _cancel_running(self, seq: Sequence, now: float) -> None:
        """A running one leaves at once (the loop closes its upstream stream)."""
        self._leave(seq, "cancelled", now)

    def receive(self, seq: UpstreamSequence, text: str, now: float) -> str:
        """A chunk of ``seq``'s text arrived; returns what to pass on ("" if it already left)."""
        if seq.status is not Status.RUNNING or not text:
            return ""
        first = seq.record.first_token_at is None
        seq.receive(text, now)
        self.recorder.streamed(seq, text, first, len(self.running), now)
        return text

    def complete(
        self, seq: UpstreamSequence, finish_reason: str, now: float,
        usage: tuple[int | None, int | None] | None = None,
    ) -> None:
        """The upstream finished ``seq`` (``usage``: its prompt and completion token counts)."""
        if seq.status is not Status.RUNNING:
            return
        if usage is not None:  # its own counts replace the estimates
            was = seq.record.prompt_tokens
            seq.report_usage(*usage)
            self.recorder.prompt_recounted(seq, was)
        seq.finish_reason = finish_reason
        self._leave(seq, "ok", now)

    def fail_request(self, seq: Sequence, error: str, now: float) -> None:
        """``seq`` failed upstream; the others go on."""
        if seq.status is Status.RUNNING:
            self._leave(seq, "failed", now, error)

    def _leave(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        self.queue.retire(seq, outcome, now, error)
        if not self.running:  # the last one out closes the span at once
            self._left_at = None
            self.recorder.left([], now)
        elif self._left_at is None:
            self._left_at = now
