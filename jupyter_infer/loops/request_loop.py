"""What both loops (a local engine's and an upstream server's) are to the service: one seam.

A loop turns a request into what it runs (``prepare``: tokenize or estimate, check the
limits), queues it (``submit``, which hands back the caller's ``RequestStream``), cancels it,
and reports its state (``snapshot``). ``RequestLoop`` holds what both share: the streams of
live requests, the end of a request (one copy), and waiting for work. The service calls
nothing else, so it has no branch on the kind of engine.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EngineUnavailable, InferError, RequestFailed
from ..values.limits import Limits
from ..values.stream import RequestStream
from .answer_stage import AnswerStage

if TYPE_CHECKING:
    from ..engine import Engine
    from ..scheduler.recorder import Recorder
    from ..scheduler.request_queue import RequestQueue
    from ..values.config import ServiceConfig
    from ..values.engine_info import EngineInfo
    from ..values.metrics import BatchRecord
    from ..values.request import Request
    from ..values.sequence import Sequence

log = logging.getLogger(__name__)


class Core(Protocol):
    """What a loop asks its sync core (the engine's ``Scheduler``, the upstream's
    ``UpstreamAdmission``): both keep their requests in a ``RequestQueue``."""

    queue: RequestQueue

    def add(self, seq: Sequence, now: float) -> None: ...

    def cancel(self, request_id: str, now: float) -> bool: ...


@dataclass
class LoopSnapshot:
    """A loop's state now, for ``status``, ``metrics`` and ``batches``."""

    waiting: list[str] = field(default_factory=list)  # request ids, queued
    running: list[str] = field(default_factory=list)  # request ids, in the engine (or upstream)
    parked: list[str] = field(default_factory=list)  # request ids sitting out for another owner's (fair share)
    open_batch: BatchRecord | None = None  # the batch record still open
    source: str = "engine"  # what a batch record is: "engine" batches or "upstream" spans
    limits: dict[str, Any] = field(default_factory=dict)  # limits known once loaded
    prefix_cache: dict[str, Any] | None = None
    kv_cache: dict[str, Any] | None = None  # what the running rows hold in KV memory (None: no KV here)
    status: dict[str, Any] = field(default_factory=dict)  # what this kind adds to status


class RequestLoop(abc.ABC):
    """The base of ``EngineLoop`` and ``UpstreamLoop``: streams, submit, cancel, the end of
    requests. Subclasses set ``scheduler`` once ready and run ``_run`` as their task."""

    source = "engine"
    what = "engine"  # in messages: "The engine is not available"
    tokenizes = True  # whether tokenizer() gives one (an upstream tokenizes on its own)

    def __init__(self, config: ServiceConfig, recorder: Recorder, *, check_model: bool = True) -> None:
        self.config = config
        self.limits = Limits.from_config(config)
        # Whether prepare checks the model a request names (behind a router, its rule did).
        self.check_model = check_model
        self.recorder = recorder
        self._state = "stopped"  # stopped | switching | loading | ready | failed
        self.load_error: str | None = None
        self.scheduler: Core | None = None  # made once ready
        self._streams: dict[str, RequestStream] = {}
        # Finishes every answer (text, stops, reasoning, tool calls); an engine's detokenizes.
        self.answers = AnswerStage()
        self._errors: dict[str, InferError] = {}  # why a request failed, when the loop knows better
        self._stop_reason: str | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    @abc.abstractmethod
    def info(self) -> EngineInfo | None: ...

    @property
    def reachable(self) -> bool | None:
        """Whether the engine answers (``None``: not known, or a local engine)."""
        return None

    def expect(self, state: str = "switching") -> None:
        """Let requests wait for this loop before it starts: a model switch starts it once the
        old one has drained, a managed server's once the child answers (``state`` meanwhile)."""
        if self._ready is None:
            self._ready, self._state = asyncio.Event(), state

    def fail(self, reason: str) -> None:
        """It will not start (``reason``: why): the requests waiting for it, and later ones, get
        a 503 that says so."""
        self._state, self.load_error = "failed", reason
        if self._ready is not None:
            self._ready.set()

    def start(self) -> None:
        """Start the loop (loading the engine, or opening the upstream); idempotent."""
        if self._task is not None:
            return
        self._wakeup = asyncio.Event()
        if self._ready is None or self._ready.is_set():
            self._ready = asyncio.Event()
        self._stop_reason = None
        self._state = "loading"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"jupyter-infer-{self.source}-loop")

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        if self._ready is None:
            raise EngineUnavailable("The inference service is not running; start it first.")
        await asyncio.wait_for(self._ready.wait(), timeout)
        info = self.info
        if info is None or self._state != "ready":
            raise EngineUnavailable(f"The {self.what} is not available: {(self.load_error or self._state).rstrip('.')}.")
        return info

    def _abort_all(self, reason: str) -> None:
        """The loop stops: every queued or running request ends with ``reason``."""
        if self.scheduler is not None:
            self.scheduler.queue.abort(reason, time.monotonic())
            self._end_finished()
        if self._ready is not None:
            self._ready.set()  # wake submitters that wait for loading

    @abc.abstractmethod
    async def stop(self, reason: str = "the inference server is shutting down") -> None: ...

    def release(self) -> None:  # noqa: B027 (a hook: only a loop with an engine has one to drop)
        """Drop what a stopped loop holds (its engine); nothing to drop by default."""

    @abc.abstractmethod
    async def _run(self) -> None: ...

    # -- requests ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def prepare(self, request: Request) -> Sequence:
        """``request`` as this loop runs it (tokenized or estimated, checked against
        ``self.limits``, ``max_tokens`` resolved); raises ``InvalidRequest`` or
        ``EngineUnavailable``. The request itself is not changed."""

    def tokenizer(self) -> Engine:
        """The engine whose text side (``engine.text``) the routes use; raises
        ``InvalidRequest`` where there is none."""
        raise NotImplementedError

    def tool_format(self) -> str:
        """How the answers of this loop's model write tool calls (``constraints/tool_formats``;
        an upstream's come back as Hermes' text)."""
        return "hermes"

    def submit(self, seq: Sequence) -> RequestStream:
        """Queue a prepared sequence (the loop must be ready); raises ``QueueFull``."""
        stream = RequestStream(seq.id, self.cancel, seq.prompt_ids)
        stream.record = seq.record
        constraint = seq.request.params.constraint
        if constraint is not None and constraint.kind == "tools":
            stream.tool_format = self.tool_format()
        self.answers.open(seq, stream.tool_format, reasons=self.info is not None and self.info.reasoning)
        self.scheduler.add(seq, time.monotonic())
        self._streams[seq.id] = stream
        self._wakeup.set()
        return stream

    def knows(self, request_id: str) -> bool:
        """Queued, running, or recently finished (the recorder remembers those)."""
        return request_id in self._streams or self.recorder.finished_recently(request_id)

    def owner_of(self, request_id: str) -> str | None:
        """Who sent a live or recently finished request (``None``: no such request)."""
        live = self.scheduler.queue.owner_of(request_id) if self.scheduler is not None else None
        return live if live is not None else self.recorder.recent_owner(request_id)

    def cancel(self, request_id: str) -> bool:
        if self.scheduler is None or not self.scheduler.cancel(request_id, time.monotonic()):
            return False
        self._end_finished()
        self._wakeup.set()
        return True

    # -- views ------------------------------------------------------------------------------
    def counts(self) -> tuple[int, int]:
        """Requests queued and running now (what the gauges read, without a snapshot)."""
        queue = self.scheduler.queue if self.scheduler is not None else None
        return (len(queue.waiting), len(queue.running)) if queue is not None else (0, 0)

    def owner_counts(self) -> dict[str, dict[str, int]]:
        """Per owner: requests queued, running and parked now."""
        out: dict[str, dict[str, int]] = {}
        if self.scheduler is None:
            return out
        queue = self.scheduler.queue
        for key, seqs in (("queued", queue.waiting), ("running", queue.running), ("parked", queue.parked)):
            for seq in seqs:
                counts = out.setdefault(seq.request.owner, {"queued": 0, "running": 0, "parked": 0})
                counts[key] += 1
        return out

    def prefix_cache(self) -> dict[str, Any] | None:
        """The engine's prefix cache stats (``None``: no engine here, or not loaded)."""
        return None

    def kv_cache(self) -> dict[str, Any] | None:
        """What the running rows hold in KV memory (``None``: no KV kept here)."""
        return None

    def snapshot(self) -> LoopSnapshot:
        if self.scheduler is None:
            return LoopSnapshot(source=self.source, open_batch=self.recorder.batch)
        queue = self.scheduler.queue
        return LoopSnapshot(
            waiting=[s.id for s in queue.waiting], running=[s.id for s in queue.running],
            parked=[s.id for s in queue.parked], open_batch=self.recorder.batch, source=self.source,
        )

    # -- shared by both loops ---------------------------------------------------------------
    async def _wait(self, wake_at: float | None) -> None:
        """Until something arrives (``submit``, ``cancel``, a slot frees) or ``wake_at``."""
        self._wakeup.clear()
        timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _end_finished(self) -> None:
        """End the streams of the sequences the core finished: their result, or why they failed."""
        for seq in self.scheduler.queue.pop_finished():
            stream = self._streams.pop(seq.id, None)
            error = self._errors.pop(seq.id, None) or seq.failure
            if stream is None:
                continue
            rec = seq.record
            if rec.outcome != "failed":
                stream.finish(self.answers.result(seq))
                continue
            if error is None:
                error_type = EngineUnavailable if self._stop_reason is not None else RequestFailed
                error = error_type(rec.error or "The request failed.")
            stream.finish(error=error)
