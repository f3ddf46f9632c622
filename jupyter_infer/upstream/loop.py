"""The async loop of ``engine = "openai"``: the front's queue in front of an upstream server.

It has the ``EngineLoop``'s small interface for the service (start, stop, wait_ready,
submit, cancel, state, load_error, info) and the same division of labour: the sync core
(``UpstreamScheduler``) decides which queued requests start, the ``Recorder`` tells what
happened. Each started request is an asyncio task that streams from the upstream and passes
every chunk on as a ``TokenEvent``; cancelling it closes its upstream connection at once.
While the upstream does not answer, a watcher probes it, so ``status`` sees it come back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import TYPE_CHECKING

from ..engine import EngineInfo
from ..errors import EngineUnavailable, InferError, RequestFailed, UpstreamError
from ..request import TokenEvent
from ..scheduler import EngineLoop
from ..scheduler.upstream import UpstreamScheduler
from ..sequence import Sequence
from ..stream import RequestStream
from .server import UpstreamConfigError, UpstreamServer
from .wire import finish_reason

if TYPE_CHECKING:
    from ..config import ServiceConfig
    from ..scheduler import Recorder

log = logging.getLogger(__name__)

UPSTREAM_TOKEN_ID = -1  # a TokenEvent's token id when the upstream sent text, not ids
PROBE_EVERY_S = (1.0, 30.0)  # while the upstream is down: first and longest wait between probes


class UpstreamLoop(EngineLoop):
    def __init__(self, config: ServiceConfig, recorder: Recorder, server: UpstreamServer | None = None) -> None:
        self.config = config
        self.recorder = recorder
        self.server = server or UpstreamServer(config)
        self.state = "stopped"  # stopped | loading | ready | failed
        self.load_error: str | None = None
        self.scheduler: UpstreamScheduler | None = None
        self._streams: dict[str, RequestStream] = {}
        self._tasks: dict[str, asyncio.Task] = {}  # one per request in flight upstream
        self._errors: dict[str, InferError] = {}  # why a request failed, for its stream
        self._stop_reason: str | None = None
        self._task: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._suspect: asyncio.Event | None = None  # set when a request could not reach it

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def info(self) -> EngineInfo | None:
        return self.server.info if self.scheduler is not None else None

    def start(self) -> None:
        """Open the connection, look at the upstream once, and start the loop; idempotent."""
        if self._task is not None:
            return
        self._wakeup, self._ready, self._suspect = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._stop_reason = None
        self.state = "loading"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="jupyter-infer-upstream-loop")

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        """Stop: every queued or running request ends with an error, upstream streams close."""
        self._stop_reason = reason
        tasks = [t for t in (self._task, self._watcher, *self._tasks.values()) if t is not None]
        self._task = self._watcher = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        if self.scheduler is not None:
            self.scheduler.abort(reason, time.monotonic())
            self._end_finished()
        if self._ready is not None:
            self._ready.set()
        await self.server.close()
        self.state = "stopped"

    async def wait_ready(self, timeout: float | None = None) -> UpstreamServer:
        if self._ready is None:
            raise EngineUnavailable("The inference service is not running; start it first.")
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.state != "ready":
            raise EngineUnavailable(f"The upstream engine is not available: {self.load_error or self.state}.")
        return self.server

    # -- requests: submit, knows and cancel are EngineLoop's ---------------------------------
    def _cancelled(self, request_id: str) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()  # closes the upstream stream: the upstream stops generating

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            self.server.open()
        except UpstreamConfigError as err:
            self.state, self.load_error = "failed", str(err)
            log.error("jupyter_infer: the upstream engine cannot start: %s", err)
            self._ready.set()
            return
        await self.server.probe()  # an upstream that is down now is not fatal: it may come
        self.scheduler = UpstreamScheduler(self.config, self.recorder)
        self.state = "ready"
        self._ready.set()
        self.recorder.ready(self.server.info)
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="jupyter-infer-upstream-watch")
        core = self.scheduler
        while True:
            newcomers, wake_at = core.start(time.monotonic())
            self._end_finished()
            for seq in newcomers:
                self._tasks[seq.id] = asyncio.get_running_loop().create_task(
                    self._serve(seq), name=f"jupyter-infer-upstream-{seq.id}")
            if not newcomers:
                await self._wait(wake_at)

    async def _serve(self, seq: Sequence) -> None:
        """Stream one request from the upstream into its ``RequestStream``."""
        core, stream = self.scheduler, self._streams[seq.id]
        reason: str | None = None
        usage: tuple[int | None, int | None] | None = None
        try:
            async with aclosing(self.server.stream(seq.request)) as chunks:
                async for chunk in chunks:
                    text = core.receive(seq, chunk.text, time.monotonic())
                    if text:
                        stream.push(TokenEvent(seq.id, seq.num_output_tokens, UPSTREAM_TOKEN_ID, text))
                    reason = chunk.finish_reason or reason
                    if chunk.has_usage:
                        usage = (chunk.prompt_tokens, chunk.completion_tokens)
            core.complete(seq, finish_reason(reason), time.monotonic(), usage)
        except asyncio.CancelledError:
            raise  # cancelled: the core has already let it go
        except Exception as err:
            if not isinstance(err, InferError):  # a bug here must fail one request, not the loop
                log.exception("jupyter_infer: upstream request %s failed", seq.id)
                err = UpstreamError(f"Relaying the upstream's answer failed: {type(err).__name__}: {err}")
            if self.server.reachable is False:
                self._suspect.set()
            self._errors[seq.id] = err
            core.fail_request(seq, err.message, time.monotonic())
        finally:
            self._tasks.pop(seq.id, None)
            self._end_finished()
            self._wakeup.set()  # a slot is free

    async def _watch(self) -> None:
        """While the upstream does not answer, probe it with growing pauses."""
        first, longest = PROBE_EVERY_S
        while True:
            if self.server.reachable is not False:
                self._suspect.clear()
                await self._suspect.wait()
            pause = first
            while not await self.server.probe():
                await asyncio.sleep(pause)
                pause = min(2 * pause, longest)

    def _end_finished(self) -> None:
        """End the streams of the requests the core finished."""
        for seq in self.scheduler.pop_finished():
            stream = self._streams.pop(seq.id, None)
            error = self._errors.pop(seq.id, None)
            if stream is None:
                continue
            rec = seq.record
            if rec.outcome == "failed":
                if error is None:
                    error_type = EngineUnavailable if self._stop_reason is not None else RequestFailed
                    error = error_type(rec.error or "The request failed.")
                stream.finish(error=error)
            else:
                stream.finish(seq.result())
