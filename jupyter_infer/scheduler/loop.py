"""The async engine loop: the engine's one thread, the running batch, and the request streams.

Each turn asks the scheduling core for a plan, runs it on the engine thread, hands the
tokens back to the core and pushes the released text to each request's stream. It owns
the executor, the running batch value and the streams, and nothing else: what to run
is the core's decision, what happened is the recorder's to tell.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..engine import Batch, Engine, EngineInfo, StepPlan
from ..errors import EngineUnavailable, RequestFailed
from ..request import TokenEvent
from ..sequence import Sequence
from ..stream import RequestStream
from .recorder import Recorder
from .scheduler import Scheduler

if TYPE_CHECKING:
    from ..config import ServiceConfig

log = logging.getLogger(__name__)



class EngineLoop:
    def __init__(self, load: Callable[[], Engine], config: ServiceConfig, recorder: Recorder) -> None:
        self._load = load
        self.config = config
        self.recorder = recorder
        self.state = "stopped"  # stopped | loading | ready | failed
        self.load_error: str | None = None
        self.engine: Engine | None = None
        self.scheduler: Scheduler | None = None  # made once the engine is loaded
        self._streams: dict[str, RequestStream] = {}
        self._batch: Batch | None = None  # the running rows, as the engine holds them
        self._partial: Batch | None = None  # the row of a prompt being prefilled in chunks
        self._stop_reason: str | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def info(self) -> EngineInfo | None:
        return self.engine.info if self.engine else None

    def start(self) -> None:
        """Start loading the engine (on the engine thread) and the loop; idempotent."""
        if self._task is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jupyter-infer-engine")
        self._wakeup = asyncio.Event()
        self._ready = asyncio.Event()
        self._stop_reason = None
        self.state = "loading"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="jupyter-infer-engine-loop")

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        """Stop the loop; every queued or running request ends with an error. Returns once a
        step that was running on the engine thread has ended."""
        task, self._task = self._task, None
        self._stop_reason = reason
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self.scheduler is not None:
            self.scheduler.abort(reason, time.monotonic())
            self._end_finished()
        if self._ready is not None:
            self._ready.set()  # wake submitters that wait for loading
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        self._batch = self._partial = None
        self.state = "stopped"

    async def wait_ready(self, timeout: float | None = None) -> Engine:
        if self._ready is None:
            raise EngineUnavailable("The inference service is not running; start it first.")
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.engine is None or self.state != "ready":
            raise EngineUnavailable(f"The engine is not available: {self.load_error or self.state}.")
        return self.engine

    # -- requests ---------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> RequestStream:
        """Queue a checked sequence (the loop must be ready); raises ``QueueFull``."""
        stream = RequestStream(seq.id, self.cancel, seq.prompt_ids)
        self.scheduler.add(seq, time.monotonic())
        self._streams[seq.id] = stream
        self._wakeup.set()
        return stream

    def knows(self, request_id: str) -> bool:
        """Queued, running, or recently finished (the recorder remembers those)."""
        return request_id in self._streams or self.recorder.finished_recently(request_id)

    def cancel(self, request_id: str) -> bool:
        if self.scheduler is None or not self.scheduler.cancel(request_id, time.monotonic()):
            return False
        self._cancelled(request_id)
        self._end_finished()
        self._wakeup.set()
        return True

    def _cancelled(self, request_id: str) -> None:
        """What a loop does at once for a cancelled request (the core retires it anyway)."""

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.engine = await loop.run_in_executor(self._executor, self._load)
            self.scheduler = Scheduler(self.config, self.engine, self.recorder)
            self.state = "ready"
        except Exception as err:
            self.state, self.load_error = "failed", f"{type(err).__name__}: {err}"
            log.error("jupyter_infer: the engine failed to load: %s", self.load_error)
        finally:
            self._ready.set()
        if self.state != "ready":
            return
        self.recorder.ready(self.engine.info)
        core = self.scheduler
        while True:
            plan, wake_at = core.schedule(time.monotonic())
            self._end_finished()
            if core.prefilling is None:
                self._partial = None  # its prompt was cancelled or failed: drop its KV
            if plan is None:
                await self._wait(wake_at)
                continue
            started = time.monotonic()
            try:
                if plan.chunk:
                    sampled, self._batch, self._partial = await loop.run_in_executor(
                        self._executor, self.engine.step_chunk, plan, self._batch, self._partial
                    )
                else:
                    sampled, self._batch = await loop.run_in_executor(
                        self._executor, self.engine.step, plan, self._batch
                    )
            except Exception as err:
                self._fail(plan, err, in_engine=True)
                continue
            try:
                released = core.postprocess(plan, sampled, started, time.monotonic())
            except Exception as err:  # a bug here must not stop the loop for everyone
                self._fail(plan, err, in_engine=False)
                continue
            for seq, token, fragment in released:
                logprobs, prompt_logprobs = seq.take_logprobs()
                if fragment or logprobs or prompt_logprobs is not None:
                    self._streams[seq.id].push(TokenEvent(
                        seq.id, len(seq.output_ids), token, fragment, logprobs, prompt_logprobs))
            self._end_finished()

    async def _wait(self, wake_at: float | None) -> None:
        self._wakeup.clear()
        timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _fail(self, plan: StepPlan, err: Exception, *, in_engine: bool) -> None:
        log.error("jupyter_infer: engine step %s (%s) failed", plan.step_id, plan.kind, exc_info=err)
        if in_engine and plan.kind == "decode":
            self._batch = None  # a decode may have half-updated the batch: start clean
        if plan.chunk:
            self._partial = None
        message = f"The engine failed while running this request: {type(err).__name__}: {err}"
        self.scheduler.fail(plan, message, time.monotonic(), retry=in_engine)
        self._end_finished()

    def _end_finished(self) -> None:
        """End the streams of the sequences the core finished."""
        for seq in self.scheduler.pop_finished():
            stream = self._streams.pop(seq.id, None)
            if stream is None:
                continue
            rec = seq.record
            if rec.outcome == "failed":
                error_type = EngineUnavailable if self._stop_reason is not None else RequestFailed
                stream.finish(error=error_type(rec.error or "The request failed."))
            else:
                stream.finish(seq.result())
