"""One listener for the scheduler's lifecycle facts; it feeds metrics, live events and batch spans.

The scheduling core says what happened (a request queued, rows admitted, a token, rows
left, a request finished, a step ran); the recorder turns each fact into the metrics'
aggregates, the ``infer/events`` stream and the batch records a timeline is drawn from.

Batch records: in ``window`` mode a batch is the group admitted together, and it lasts until
its last member leaves. In ``continuous`` mode a batch is a span of constant membership: a
new record opens whenever a request joins or leaves, so a timeline shows exactly who ran
with whom, and when. For an upstream server (``source="upstream"``) a span is the set of
requests in flight upstream together; the upstream batches them its own way.

Behind a router, each backend's recorder names its ``route`` on every record and event, and
the backends draw batch ids from one counter, so their records can be merged.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

from ..values.events import EventBus
from ..values.metrics import BatchRecord, MetricsCollector, wall

if TYPE_CHECKING:
    from ..values.engine_info import EngineInfo
    from ..values.sequence import Sequence
    from ..values.step import StepPlan


RECENT_IDS = 1024  # finished request ids remembered (a reconnecting EventSource names one)


class Recorder:
    def __init__(
        self, mode: str, metrics: MetricsCollector, events: EventBus, *, source: str = "engine",
        route: str | None = None, batch_ids: Iterator[int] | None = None,
    ) -> None:
        self.mode = mode
        self.metrics = metrics
        self.events = events
        self.source = source
        self.route = route
        self.batch: BatchRecord | None = None  # the open batch record
        self._batch_ids = batch_ids or itertools.count(1)
        self._recent: OrderedDict[str, str] = OrderedDict()  # recently finished requests' owners, by id

    def ready(self, info: EngineInfo) -> None:
        self._emit("ready", engine=info.engine, model=info.model, mode=self.mode)

    # -- requests ---------------------------------------------------------------------------
    def queued(self, seq: Sequence, depth: int) -> None:
        rec = seq.record
        rec.route = self.route
        self.metrics.queued(rec, depth)
        self._emit("queued", id=rec.id, owner=rec.owner, priority=rec.priority, prompt_tokens=rec.prompt_tokens,
                   at=wall(rec.queued_at), constraint=rec.constraint)

    def rejected(self, reason: str, outcome: str = "rejected") -> None:
        self.metrics.rejected(reason, outcome)

    def admitted(self, newcomers: Seq[Sequence], running: Seq[Sequence], now: float) -> None:
        """``newcomers`` joined; ``running`` is every running row now, newcomers included."""
        members = newcomers if self.mode == "window" or self.batch is None else running
        self._open_batch(members, now)
        for seq in newcomers:
            rec = seq.record
            rec.admitted_at, rec.outcome = now, "running"
            rec.batch_id, rec.batch_size = self.batch.id, len(members)
            self.metrics.admitted(rec)
            self._emit("admitted", id=rec.id, owner=rec.owner, batch_id=rec.batch_id, at=wall(now))

    def parked(self, seq: Sequence, running: Seq[Sequence], now: float) -> None:
        """``seq`` sits out (fair share), ``running`` stay: a new span without it."""
        self.metrics.parked()
        self._emit("parked", id=seq.id, owner=seq.request.owner, at=wall(now))
        self.left(running, now)

    def resumed(self, seq: Sequence, running: Seq[Sequence], now: float) -> None:
        """``seq`` is back among ``running`` (where it is now)."""
        self._emit("resumed", id=seq.id, owner=seq.request.owner, at=wall(now))
        if self.mode == "continuous":
            self._open_batch(running, now)

    def token(self, seq: Sequence, fragment: str, first: bool) -> None:
        if first:
            self.metrics.first_token(seq.record)
        if fragment and self.events.has_subscribers:
            self._emit("token", id=seq.id, owner=seq.request.owner, index=seq.num_output_tokens, text=fragment)

    def streamed(self, seq: Sequence, fragment: str, first: bool, in_flight: int, now: float) -> None:
        """A chunk of an upstream request arrived (no steps upstream: each chunk counts as a
        token of the span, with ``in_flight`` requests running)."""
        self.token(seq, fragment, first)
        if self.batch is not None:
            self.batch.tokens += 1
        self.metrics.step("decode", in_flight, 1, 0.0, now)

    def prompt_recounted(self, seq: Sequence, was: int) -> None:
        """``seq``'s prompt tokens were ``was`` (an upstream's estimate, now its own count)."""
        if seq.record.prompt_tokens != was:
            self.metrics.prompt_counted(seq.record, was)

    def left(self, running: Seq[Sequence], now: float) -> None:
        """Rows left (``running`` is who stays): close the batch when it is empty; in
        continuous mode the survivors form a new span (one per step, however many left)."""
        if not running:
            self._close_batch(now)
        elif self.mode == "continuous" and self.batch is not None and len(self.batch.members) != len(running):
            self._open_batch(running, now)

    def finished(self, seq: Sequence) -> None:
        self._recent[seq.id] = seq.request.owner
        if len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)
        rec = seq.record
        rec.completion_tokens = seq.num_output_tokens
        self.metrics.finished(rec)
        self._emit("finished", id=rec.id, owner=rec.owner, outcome=rec.outcome, finish_reason=rec.finish_reason,
                   completion_tokens=rec.completion_tokens, at=wall(rec.finished_at), error=rec.error,
                   forced_tokens=rec.forced_tokens)

    def finished_recently(self, request_id: str) -> bool:
        return request_id in self._recent

    def recent_owner(self, request_id: str) -> str | None:
        """Who sent a recently finished request (``None``: not one of those)."""
        return self._recent.get(request_id)

    # -- steps ------------------------------------------------------------------------------
    def step(self, plan: StepPlan, seqs: Seq[Sequence], produced: int, started: float, now: float, *,
             forced: int = 0, drafts: tuple[int, int] = (0, 0)) -> None:
        """Count a finished step (``seqs``: its rows) in the batch that ran it (before rows
        leave); ``forced``: of its ``produced`` tokens, those grammars forced; ``drafts``: the
        draft tokens its rows proposed and those their model accepted (speculation)."""
        batch = self.batch
        if batch is not None:
            batch.steps += 1
            batch.tokens += produced
            batch.forced_tokens += forced
            batch.draft_tokens += drafts[0]
            batch.accepted_tokens += drafts[1]
            if any(plan.prompt):
                batch.prefill_steps += 1
                # A prompt counts once, when complete (a chunked one, at its last chunk).
                batch.prompt_tokens += sum(s.num_prompt_tokens for s, p in zip(seqs, plan.prompt, strict=True)
                                           if p and s.num_computed >= len(s.prompt_ids))
        # A mixed step is the decoding rows' step (the newcomers' prompts rode in it).
        decoding = plan.prompt.count(False)
        self.metrics.step("decode" if decoding else "prefill", decoding or len(seqs), produced, now - started,
                          now, drafts)
        if self.events.has_subscribers:  # the member list is per-step work: only when watched
            self._emit("step", step_id=plan.step_id, kind=plan.kind, chunk=plan.chunk,
                       members=list(plan.ids), owners=[s.request.owner for s in seqs],
                       tokens=produced, forced=forced, drafted=drafts[0], accepted=drafts[1],
                       batch_id=batch.id if batch else None,
                       started_at=wall(started), ended_at=wall(now))

    def _open_batch(self, members: Seq[Sequence], now: float) -> None:
        self._close_batch(now)
        self.batch = BatchRecord(next(self._batch_ids), self.mode, [s.id for s in members], now,
                                 [s.request.owner for s in members], source=self.source, route=self.route)
        for seq in members:
            ids = seq.record.batch_ids
            if not ids or ids[-1] != self.batch.id:
                ids.append(self.batch.id)
        self._emit("batch", state="open", **self.batch.to_json())

    def _close_batch(self, now: float) -> None:
        if self.batch is not None:
            self.batch.ended_at = now
            if self.source == "upstream":  # busy while anything is in flight
                self.metrics.busy(now - self.batch.started_at)
            self.metrics.batch_closed(self.batch)
            self._emit("batch", state="closed", **self.batch.to_json())
            self.batch = None

    def _emit(self, kind: str, /, **data: Any) -> None:
        if self.events.has_subscribers:
            if self.route is not None:
                data["route"] = self.route
            self.events.publish({"type": kind, **data})
