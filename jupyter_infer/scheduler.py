"""The heart: admission, priorities, window or continuous batching, cancellation, events.

One asyncio loop, one engine thread. Each turn of ``_run`` asks ``_schedule`` for a
``StepPlan`` (prefill newcomers, or decode one token for every running row), runs it in the
engine thread, and hands the tokens to ``_postprocess``, which streams them to their
requests and retires the finished ones. State transitions: WAITING → RUNNING → FINISHED,
and WAITING → FINISHED for a request cancelled in the queue.

Batch records: in ``window`` mode a batch is the group admitted together, and it runs until
its last member leaves. In ``continuous`` mode a batch is a span of constant membership: a
new record opens whenever a request joins or leaves, so a timeline shows exactly who ran
with whom, and when.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .engine import Engine, StepPlan
from .errors import EngineUnavailable, InvalidRequest, QueueFull, RequestFailed
from .events import EventBus
from .metrics import BatchRecord, MetricsCollector, wall
from .request import Request, RequestResult, TokenEvent
from .sequence import Sequence, Status

log = logging.getLogger(__name__)
MODES = ("continuous", "window")


@dataclass
class SchedulerConfig:
    mode: str = "continuous"
    batch_window_ms: float = 50.0
    max_batch_size: int = 16
    max_queue_size: int = 256
    max_new_tokens: int = 512
    max_prompt_tokens: int = 2048
    max_prefill_tokens: int = 4096  # prompt tokens (padded) one prefill step may run
    decode_steps_per_prefill: int = 1  # decode steps the running rows get between two prefills
    # Continuous mode, idle engine: admit once no request arrived for this long (at most 10x
    # this after the first arrival), so that a burst landing over some ms (16 HTTP requests
    # take ~15 ms to arrive) shares one prefill instead of two; a lone request waits 5 ms.
    idle_admit_delay_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        for name in ("max_batch_size", "max_queue_size", "max_new_tokens", "max_prompt_tokens", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        for name in ("batch_window_ms", "idle_admit_delay_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")


class _End:
    """Marks the end of a request's token stream."""


class RequestStream:
    """What ``Scheduler.submit`` returns: iterate for ``TokenEvent``s, await ``result()``."""

    def __init__(self, seq: Sequence, scheduler: Scheduler) -> None:
        self.seq = seq
        self._scheduler = scheduler
        self._events: asyncio.Queue[TokenEvent | _End] = asyncio.Queue()
        self._result: asyncio.Future[RequestResult] = asyncio.get_running_loop().create_future()

    @property
    def id(self) -> str:
        return self.seq.id

    @property
    def done(self) -> bool:
        return self._result.done()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                event = await self._events.get()
                if isinstance(event, _End):
                    break
                yield event
            if self._result.exception() is not None:
                raise self._result.exception()
        finally:
            if not self.done:  # the consumer walked away: free the slot
                self.cancel()

    async def result(self) -> RequestResult:
        """The final result; raises ``RequestFailed`` if the engine failed this request."""
        return await asyncio.shield(self._result)

    def cancel(self) -> None:
        self._scheduler.cancel(self.id)

    # -- called by the scheduler ----------------------------------------------------------
    def _push(self, event: TokenEvent) -> None:
        self._events.put_nowait(event)

    def _finish(self, result: RequestResult | None = None, error: BaseException | None = None) -> None:
        if self._result.done():
            return
        if error is not None:
            self._result.set_exception(error)
            self._result.exception()  # mark retrieved: a stream nobody awaits must not warn
        else:
            self._result.set_result(result)
        self._events.put_nowait(_End())


class Scheduler:
    def __init__(
        self,
        engine: Engine | Callable[[], Engine],
        config: SchedulerConfig | None = None,
        metrics: MetricsCollector | None = None,
        events: EventBus | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        self.metrics = metrics or MetricsCollector()
        self.events = events or EventBus()
        self._load = engine if callable(engine) and not isinstance(engine, Engine) else (lambda: engine)
        self.engine: Engine | None = None
        self.state = "stopped"  # stopped | loading | ready | failed
        self.load_error: str | None = None
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._streams: dict[str, RequestStream] = {}
        self._release: list[str] = []
        self._window_opened: float | None = None
        self._last_arrival = 0.0
        self._decodes_since_prefill = 0
        self._batch: BatchRecord | None = None
        self._batch_ids = itertools.count(1)
        self._step_ids = itertools.count(1)
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start loading the engine (in the engine thread) and the scheduling loop."""
        if self._task is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jupyter-infer-engine")
        self._wakeup = asyncio.Event()
        self._ready = asyncio.Event()
        self.state = "loading"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="jupyter-infer-scheduler")

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        """Stop the loop; every queued or running request ends with an error."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for seq in self.waiting + self.running:
            self._finish(seq, "failed", error=EngineUnavailable(reason))
        self.waiting.clear()
        self.running.clear()
        if self._ready is not None:
            self._ready.set()  # wake submitters that wait for loading
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self.state = "stopped"

    async def wait_ready(self, timeout: float | None = None) -> Engine:
        if self._ready is None:
            raise EngineUnavailable("The scheduler is not running; start it first.")
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.engine is None or self.state != "ready":
            raise EngineUnavailable(f"The engine is not available: {self.load_error or self.state}.")
        return self.engine

    # -- the public API -------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Queue ``request``; raise ``InvalidRequest``/``QueueFull`` without queueing anything."""
        engine = await self.wait_ready()
        limits = self.config
        if request.params.max_tokens > limits.max_new_tokens:
            self.metrics.rejected("invalid")
            raise InvalidRequest(
                f"'max_tokens' is {request.params.max_tokens}, above this server's limit of "
                f"{limits.max_new_tokens} (InferApp.max_new_tokens).", param="max_tokens",
            )
        prompt_ids = engine.tokenize(request.prompt)
        if not prompt_ids:
            self.metrics.rejected("invalid")
            raise InvalidRequest("The prompt is empty after tokenization: send some text.", param="prompt")
        if len(prompt_ids) > limits.max_prompt_tokens:
            self.metrics.rejected("invalid")
            raise InvalidRequest(
                f"The prompt has {len(prompt_ids)} tokens, above this server's limit of "
                f"{limits.max_prompt_tokens} (InferApp.max_prompt_tokens). Shorten it.", param="prompt",
            )
        room = engine.info.max_context - len(prompt_ids)
        if request.params.max_tokens > room:
            self.metrics.rejected("invalid")
            raise InvalidRequest(
                f"The prompt ({len(prompt_ids)} tokens) plus max_tokens ({request.params.max_tokens}) "
                f"exceeds the model's context of {engine.info.max_context} tokens; ask for at most "
                f"{max(room, 0)} tokens or shorten the prompt.", param="max_tokens",
            )
        if len(self.waiting) >= limits.max_queue_size:
            self.metrics.rejected("queue_full")
            raise QueueFull(
                f"The queue is full ({limits.max_queue_size} waiting requests). Retry shortly, "
                "or raise InferApp.max_queue_size.", retry_after=1.0,
            )
        seq = Sequence(request, prompt_ids)
        stream = RequestStream(seq, self)
        self._streams[seq.id] = stream
        now = time.monotonic()
        if not self.waiting:  # the first request into an empty queue opens the window
            self._window_opened = now
        self._last_arrival = now
        self.waiting.append(seq)
        self.metrics.queued(seq.id, request.priority, len(prompt_ids), request.arrival, len(self.waiting))
        self._emit("queued", id=seq.id, priority=request.priority, prompt_tokens=len(prompt_ids),
                   at=wall(request.arrival))
        self._wakeup.set()
        return stream

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: dropped now if queued, at the next step if running."""
        stream = self._streams.get(request_id)
        if stream is None:
            return False
        seq = stream.seq
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
            self._finish(seq, "cancelled")
        elif seq.status is Status.RUNNING:
            seq.cancelled = True
            if self._wakeup is not None:
                self._wakeup.set()
        return True

    def status(self) -> dict[str, Any]:
        info = self.engine.info if self.engine else None
        return {
            "state": self.state,
            "load_error": self.load_error,
            "mode": self.config.mode,
            "engine": info.engine if info else None,
            "model": info.model if info else None,
            "device": info.device if info else None,
            "dtype": info.dtype if info else None,
            "max_context": info.max_context if info else None,
            "fallback_reason": info.fallback_reason if info else None,
            "details": info.details if info else {},
            "limits": {
                "batch_window_ms": self.config.batch_window_ms,
                "max_batch_size": self.config.max_batch_size,
                "max_queue_size": self.config.max_queue_size,
                "max_new_tokens": self.config.max_new_tokens,
                "max_prompt_tokens": self.config.max_prompt_tokens,
                "max_prefill_tokens": self.config.max_prefill_tokens,
            },
            "queue_depth": len(self.waiting),
            "running": len(self.running),
        }

    def snapshot(self) -> dict[str, Any]:
        return self.metrics.snapshot(queue_depth=len(self.waiting), running=len(self.running))

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.engine = await loop.run_in_executor(self._executor, self._load)
            self.engine.reset()  # an engine handed over by a previous scheduler may hold rows
            self.state = "ready"
        except Exception as err:
            self.state, self.load_error = "failed", f"{type(err).__name__}: {err}"
            log.error("jupyter_infer: the engine failed to load: %s", self.load_error)
        finally:
            self._ready.set()
        if self.state != "ready":
            return
        self._emit("ready", **{k: v for k, v in self.status().items() if k in ("engine", "model", "mode")})
        while True:
            plan, wake_at = self._schedule()
            if plan is None:
                if self._release:  # idle: free the rows of finished requests now
                    release, self._release = self._release, []
                    try:
                        await loop.run_in_executor(self._executor, self.engine.release, release)
                    except Exception:
                        log.exception("jupyter_infer: releasing rows failed; resetting the engine")
                        self.engine.reset()
                    continue
                await self._wait(wake_at)
                continue
            started = time.monotonic()
            try:
                tokens = await loop.run_in_executor(self._executor, self.engine.step, plan)
            except Exception as err:
                self._fail_step(plan, err)
                continue
            try:
                self._postprocess(plan, tokens, started)
            except Exception as err:  # a bug here must not stop the loop for everyone
                self._fail_step(plan, err, in_engine=False)

    async def _wait(self, wake_at: float | None) -> None:
        self._wakeup.clear()
        timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _schedule(self) -> tuple[StepPlan | None, float | None]:
        """Decide the next step: retire cancelled rows, admit newcomers or decode."""
        cancelled = [s for s in self.running if s.cancelled]
        for seq in cancelled:
            self._retire(seq, "cancelled")
        if cancelled:
            self._update_span()
        newcomers, wake_at = self._admit()
        release, self._release = self._release, []
        if newcomers:
            self._decodes_since_prefill = 0
            return StepPlan(next(self._step_ids), "prefill", newcomers, release), None
        if self.running:
            self._decodes_since_prefill += 1
            return StepPlan(next(self._step_ids), "decode", list(self.running), release), None
        self._release = release  # nothing runs: hand these over with the next step
        return None, wake_at

    def _admit(self) -> tuple[list[Sequence], float | None]:
        cfg = self.config
        if not self.waiting:
            return [], None
        now = time.monotonic()
        if cfg.mode == "window" and self.running:
            return [], None  # the classic batcher runs a batch to completion
        if self.running:
            if self._decodes_since_prefill < cfg.decode_steps_per_prefill:
                return [], None  # let the running streams make progress first
        else:
            # An idle engine waits for the window (window mode), or a few ms (continuous).
            if self._window_opened is None:
                self._window_opened = now
            if cfg.mode == "window":
                deadline = self._window_opened + cfg.batch_window_ms / 1000
            else:
                quiet = cfg.idle_admit_delay_ms / 1000
                deadline = min(self._window_opened + 10 * quiet, self._last_arrival + quiet)
            if len(self.waiting) < cfg.max_batch_size and now < deadline:
                return [], deadline
        room = cfg.max_batch_size - len(self.running)
        newcomers: list[Sequence] = []
        longest = 0
        for seq in sorted(self.waiting, key=lambda s: s.priority_key):
            if len(newcomers) >= room or (newcomers and (seq.alone or newcomers[0].alone)):
                break
            longest_if = max(longest, seq.num_prompt_tokens)
            if newcomers and longest_if * (len(newcomers) + 1) > cfg.max_prefill_tokens:
                break  # padded prefill over budget; the rest waits for the next prefill
            newcomers.append(seq)
            longest = longest_if
        if not newcomers:
            return [], None
        admitted = set(map(id, newcomers))
        self.waiting = [s for s in self.waiting if id(s) not in admitted]
        # Leftovers of a window batch open the next window now.
        self._window_opened = now if self.waiting else None
        self._open_batch(newcomers, now)
        return newcomers, None

    def _open_batch(self, newcomers: list[Sequence], now: float) -> None:
        if self.config.mode == "window" or self._batch is None:
            members = newcomers
        else:
            members = self.running + newcomers
        self._close_batch(now)
        self._batch = BatchRecord(next(self._batch_ids), self.config.mode, [s.id for s in members], now)
        for seq in newcomers:
            seq.status = Status.RUNNING
            seq.admitted_at = now
            seq.batch_id = self._batch.id
            seq.batch_size = len(members)
            self.metrics.admitted(seq.id, self._batch.id, now)
            self._emit("admitted", id=seq.id, batch_id=self._batch.id, at=wall(now))
        for seq in members:
            self.metrics.joined_batch(seq.id, self._batch.id)
        self.running.extend(newcomers)
        self._emit("batch", state="open", **self._batch.to_json())

    def _close_batch(self, now: float) -> None:
        if self._batch is not None:
            self._batch.ended_at = now
            self.metrics.batch_closed(self._batch)
            self._emit("batch", state="closed", **self._batch.to_json())
            self._batch = None

    def _postprocess(self, plan: StepPlan, tokens: list[int], started: float) -> None:
        now = time.monotonic()
        engine = self.engine
        live = [(seq, token) for seq, token in zip(plan.seqs, tokens, strict=True)
                if seq.status is Status.RUNNING and not seq.cancelled]
        produced = len(live)
        # Count the step in the batch that ran it, before retirements open the next span.
        batch = self._batch
        if batch is not None:
            batch.steps += 1
            batch.tokens += produced
            if plan.kind == "prefill":
                batch.prefill_steps += 1
                batch.prompt_tokens += plan.num_tokens
        for seq, token in live:
            first = seq.first_token_at is None
            fragment = seq.append(token, engine.detokenize, engine.eos_token_ids)
            if first:
                self.metrics.first_token(seq.id, seq.first_token_at)
            index = len(seq.output_ids)
            if fragment:
                self._streams[seq.id]._push(TokenEvent(seq.id, index, token, fragment))
                if self.events.has_subscribers:
                    self._emit("token", id=seq.id, index=index, text=fragment)
            if seq.finish_reason is not None:
                self._retire(seq, "ok")
        self._update_span()
        self.metrics.step(plan.kind, len(plan.seqs), produced, now - started, now)
        if self.events.has_subscribers:
            self._emit("step", step_id=plan.step_id, kind=plan.kind, members=[s.id for s in plan.seqs],
                       tokens=produced, batch_id=batch.id if batch else None,
                       started_at=wall(started), ended_at=wall(now))

    def _fail_step(self, plan: StepPlan, err: Exception, *, in_engine: bool = True) -> None:
        """An engine error fails only the requests of this step; the loop goes on.

        A failed prefill of several newcomers fails none of them yet: each is retried in a
        prefill of its own, so one bad prompt cannot take down the requests admitted with it.
        """
        log.exception("jupyter_infer: engine step %s (%s) failed", plan.step_id, plan.kind, exc_info=err)
        message = f"The engine failed while running this request: {type(err).__name__}: {err}"
        if plan.kind == "decode":
            self.engine.reset()  # the batch state may be half-updated: start clean
            self._release.clear()
        else:
            self._release.extend(s.id for s in plan.seqs)
            retry = [s for s in plan.seqs if s.status is Status.RUNNING and not s.output_ids]
            if in_engine and len(plan.seqs) > 1 and len(retry) == len(plan.seqs):
                for seq in retry:
                    self.running.remove(seq)
                    seq.status, seq.alone = Status.WAITING, True
                self.waiting[:0] = retry
                self._update_span()
                return
        for seq in plan.seqs:
            if seq.status is Status.RUNNING:
                self._retire(seq, "failed", error=RequestFailed(message))
        self._update_span()

    def _retire(self, seq: Sequence, outcome: str, error: Exception | None = None) -> None:
        """A running request leaves the batch (its engine row goes with the next step)."""
        self.running.remove(seq)
        self._release.append(seq.id)
        self._finish(seq, outcome, error=error)

    def _update_span(self) -> None:
        """After rows left: close the batch when it is empty; in continuous mode the
        survivors of a changed membership form a new span (one per step, however many left)."""
        now = time.monotonic()
        if not self.running:
            self._close_batch(now)
        elif (self.config.mode == "continuous" and self._batch is not None
              and len(self._batch.members) != len(self.running)):
            survivors = [s.id for s in self.running]
            self._close_batch(now)
            self._batch = BatchRecord(next(self._batch_ids), self.config.mode, survivors, now)
            for row_id in survivors:
                self.metrics.joined_batch(row_id, self._batch.id)
            self._emit("batch", state="open", **self._batch.to_json())

    def _finish(self, seq: Sequence, outcome: str, error: Exception | None = None) -> None:
        now = time.monotonic()
        seq.status = Status.FINISHED
        seq.finished_at = now
        if outcome == "cancelled":
            seq.finish_reason = "cancelled"
        stream = self._streams.pop(seq.id, None)
        self.metrics.finished_request(
            seq.id, outcome, now, len(seq.output_ids), seq.finish_reason,
            None if error is None else str(error),
        )
        self._emit("finished", id=seq.id, outcome=outcome, finish_reason=seq.finish_reason,
                   completion_tokens=len(seq.output_ids), at=wall(now),
                   error=None if error is None else str(error))
        if stream is None:
            return
        if error is not None:
            stream._finish(error=error)
            return
        arrival = seq.request.arrival
        stream._finish(RequestResult(
            id=seq.id,
            text=seq.text,
            finish_reason=seq.finish_reason or outcome,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=len(seq.output_ids),
            batch_id=seq.batch_id,
            batch_size=seq.batch_size,
            queued_ms=((seq.admitted_at or now) - arrival) * 1000,
            ttft_ms=None if seq.first_token_at is None else (seq.first_token_at - arrival) * 1000,
            total_ms=(now - arrival) * 1000,
        ))

    def _emit(self, kind: str, /, **data: Any) -> None:
        if self.events.has_subscribers:
            self.events.publish({"type": kind, **data})
