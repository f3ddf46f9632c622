"""The async loop of ``engine = "openai"``: the front's queue in front of an upstream server.

It is a ``RequestLoop``, the seam the service talks to (prepare, submit, cancel, snapshot),
with the ``EngineLoop``'s division of labour: the sync core
(``UpstreamAdmission``) decides which queued requests start, the ``Recorder`` tells what
happened. Each started request is an asyncio task that streams from the upstream and passes
every chunk on as a ``TokenEvent`` (read by the answer stage); cancelling it closes its upstream connection at once.
While the upstream does not answer, a watcher probes it, so ``status`` sees it come back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import TYPE_CHECKING

from ..errors import InferError, InvalidRequest, UpstreamError
from ..upstream.admission import UpstreamAdmission
from ..upstream.connection import UpstreamConfigError, UpstreamServer
from ..upstream.upstream_sequence import UpstreamSequence
from ..values.engine_info import EngineInfo
from ..values.limits import check_model
from ..wire.upstream_openai import estimate_tokens, finish_reason
from .request_loop import LoopSnapshot, RequestLoop

if TYPE_CHECKING:
    from ..engine import Engine
    from ..scheduler import Recorder
    from ..upstream.managed_server import ManagedServer
    from ..values.config import ServiceConfig
    from ..values.request import Request

log = logging.getLogger(__name__)

UPSTREAM_TOKEN_ID = -1  # a TokenEvent's token id when the upstream sent text, not ids
PROBE_EVERY_S = (1.0, 30.0)  # while the upstream is down: first and longest wait between probes
TIMELINE = ("upstream spans: a batch record is a set of requests in flight upstream together; "
            "the upstream batches them its own way")


class UpstreamLoop(RequestLoop):
    source = "upstream"
    what = "upstream engine"
    tokenizes = False

    def __init__(
        self, config: ServiceConfig, recorder: Recorder, server: UpstreamServer | None = None, *,
        check_model: bool = True,
    ) -> None:
        super().__init__(config, recorder, check_model=check_model)
        self.server = server or UpstreamServer(config)
        self.scheduler: UpstreamAdmission | None = None
        self._tasks: dict[str, asyncio.Task] = {}  # one per request in flight upstream
        self._watcher: asyncio.Task | None = None
        self._suspect = asyncio.Event()  # set when a request could not reach it
        # A serving engine this server started for this loop (a managed child): stopped with it.
        self.child: ManagedServer | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo | None:
        return self.server.info if self.scheduler is not None else None

    @property
    def state(self) -> str:
        """``unreachable`` too: an upstream that does not answer now (it may come back;
        requests get 503 meanwhile)."""
        if self._state == "ready" and self.server.reachable is False:
            return "unreachable"
        return self._state

    @property
    def reachable(self) -> bool | None:
        return self.server.reachable

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        """Stop: every queued or running request ends with an error, upstream streams close."""
        self._stop_reason = reason
        tasks = [t for t in (self._task, self._watcher, *self._tasks.values()) if t is not None]
        self._task = self._watcher = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._abort_all(reason)
        await self.server.close()
        if self.child is not None:
            await self.child.stop()
        self._state = "stopped"

    # -- requests ---------------------------------------------------------------------------
    async def prepare(self, request: Request) -> UpstreamSequence:
        """The upstream tokenizes: the prompt's size is estimated here; a chat goes as a chat."""
        await self.wait_ready()
        self.limits.screen(request, None, self.server.info.max_context)
        if request.prompt_ids is not None:
            raise InvalidRequest(
                "Token-id prompts need this server's tokenizer, and engine 'openai' forwards text: "
                "send the prompt as text.", param="prompt",
            )
        if request.embed:
            raise InvalidRequest(
                "Embeddings are not forwarded to an upstream server (engine 'openai') yet: ask its own "
                "/v1/embeddings, or serve an embedding model here.", param="model",
            )
        if request.context_files:
            raise InvalidRequest(
                "Other files for an infill ('input_extra') need this server's tokenizer, and engine "
                "'openai' forwards text: leave them out, or ask the upstream's own infill route.",
                param="input_extra",
            )
        if request.params.logprobs is not None or request.params.prompt_logprobs is not None:
            raise InvalidRequest(
                "Log probabilities are not passed back from an upstream server (engine 'openai') "
                "yet: leave 'logprobs' and 'echo' out.", param="logprobs",
            )
        prompt_tokens = estimate_tokens(request)
        if self.check_model:
            check_model(request, self.server.info)
        request = self.limits.check(request, prompt_tokens, self.server.info.max_context, estimated=True)
        return UpstreamSequence(request, [], prompt_tokens=prompt_tokens)

    def tokenizer(self) -> Engine:
        raise InvalidRequest(
            "engine 'openai' has no tokenizer of its own: the upstream server tokenizes "
            "(ask its tokenize route, if it has one)."
        )

    def cancel(self, request_id: str) -> bool:
        if not super().cancel(request_id):
            return False
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()  # closes the upstream stream: the upstream stops generating
        return True

    def snapshot(self) -> LoopSnapshot:
        snap = super().snapshot()
        snap.status = {"upstream": self.server.describe(), "timeline": TIMELINE}
        return snap

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            self.server.open()
        except UpstreamConfigError as err:
            self._state, self.load_error = "failed", str(err)
            log.error("jupyter_infer: the upstream engine cannot start: %s", err)
            self._ready.set()
            return
        await self.server.probe()  # an upstream that is down now is not fatal: it may come
        self.scheduler = UpstreamAdmission(self.config, self.recorder)
        self._state = "ready"
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

    async def _serve(self, seq: UpstreamSequence) -> None:
        """Stream one request from the upstream into its ``RequestStream``."""
        core, stream = self.scheduler, self._streams[seq.id]
        reason: str | None = None
        usage: tuple[int | None, int | None] | None = None
        try:
            async with aclosing(self.server.stream(seq.request)) as chunks:
                async for chunk in chunks:
                    text = core.receive(seq, chunk.text, time.monotonic())
                    event = self.answers.take_text(seq, text, UPSTREAM_TOKEN_ID) if text else None
                    if event is not None:
                        stream.push(event)
                    reason = chunk.finish_reason or reason
                    if chunk.has_usage:
                        usage = (chunk.prompt_tokens, chunk.completion_tokens)
            ours, event = self.answers.end_text(seq, finish_reason(reason), UPSTREAM_TOKEN_ID)
            if event is not None:
                stream.push(event)
            core.complete(seq, ours, time.monotonic(), usage)
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
