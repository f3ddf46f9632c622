"""The embedded backend: an ``InferenceService`` in this process, on the client's I/O loop.

It talks to the service only through its public seam (``submit``, ``cancel``, ``status``,
``metrics``, ``batches``, ``wait_ready``, ``limits``), and answers in the same JSON as the
server, so a ``Client`` behaves alike on both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ...errors import EngineUnavailable
from ...wire.native import native_answer
from .backend import Accepted, Final, Fragment, StreamItem
from .io_thread import IOThread

if TYPE_CHECKING:
    from ...service.inference import InferenceService

_shared_service: InferenceService | None = None
_started: dict[int, InferenceService] = {}  # by id(): services compare by value


class QuietFallback(logging.Filter):
    """An embedded engine's fallback to the simulated engine is logged at INFO, once per
    process and reason: in a kernel a WARNING lands in a cell's output as red stderr (Python's
    last-resort handler), once per engine, though ``status()["fallback_reason"]`` says why.
    A server's own engine still warns: this filter is installed only where engines are
    embedded."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        from ...engine import FALLBACK_MESSAGE

        if record.msg != FALLBACK_MESSAGE:
            return True
        if record.getMessage() in self.logged:
            return False
        self.logged.add(record.getMessage())
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


_quiet_fallback = QuietFallback()


def make_embedded_service() -> InferenceService:
    """The engine embedded mode uses: the server's defaults (``auto`` engine, continuous)."""
    from ...service.inference import InferenceService

    return InferenceService()


def shared_service() -> InferenceService:
    """One embedded engine per process, so that every client's requests batch together."""
    global _shared_service
    if _shared_service is None:
        _shared_service = make_embedded_service()
    return _shared_service


async def _stop_started() -> None:
    while _started:
        _, service = _started.popitem()
        await service.stop()


class EmbeddedBackend:
    """``Backend`` for an engine in this process (``service``, or the process's shared one)."""

    url = None
    token = None

    def __init__(self, service: InferenceService | None = None) -> None:
        self._service = service

    @property
    def service(self) -> InferenceService:
        if self._service is None:
            self._service = shared_service()
        return self._service

    def _started(self) -> InferenceService:
        """The service, started on this (the I/O) loop; stopped when the process exits."""
        service = self.service
        if id(service) not in _started:
            engine_log = logging.getLogger("jupyter_infer.engine")
            if _quiet_fallback not in engine_log.filters:
                engine_log.addFilter(_quiet_fallback)
            service.start()  # idempotent
            _started[id(service)] = service
            IOThread.get().at_shutdown(_stop_started)
        return service

    def _request(self, body: dict[str, Any]) -> Any:
        from ...wire.native import parse_generate

        return parse_generate(body, max_new_tokens=self.service.limits.max_new_tokens)

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        service = self._started()
        request = self._request(body)
        stream = await service.submit(request)
        try:
            return native_answer(await stream.result(), request, stream)
        except asyncio.CancelledError:
            stream.cancel()
            raise

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[StreamItem]:
        service = self._started()
        request = self._request(body)
        stream = await service.submit(request)
        try:
            yield Accepted(stream.id)
            async for event in stream:
                if event.text:
                    yield Fragment(event.request_id, event.text)
            yield Final(native_answer(await stream.result(), request, stream))
        finally:
            if not stream.done:  # the consumer left early: free the slot now
                stream.cancel()

    async def status(self) -> dict[str, Any]:
        return self._started().status()

    async def metrics(self) -> dict[str, Any]:
        return self._started().metrics()

    async def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        return self._started().batches(limit, requests)

    async def models(self, method: str = "GET", body: dict[str, Any] | None = None) -> dict[str, Any]:
        service = self._started()
        shelf = getattr(service, "models", None)
        if shelf is not None and method == "POST":
            options = dict(body or {})
            await shelf.load(options.pop("model"), **options)
        elif shelf is not None and method == "DELETE":
            await shelf.unload()
        return shelf.answer() if shelf is not None else {"state": service.state, "models": []}

    async def cancel(self, request_id: str) -> bool:
        return self._started().cancel(request_id)

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        service = self._started()
        try:
            await service.wait_ready(timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"The embedded engine is still loading after {timeout:.0f} s.") from None
        return service.status()

    async def close(self) -> None:
        # A service given to this client is stopped with it; the shared one serves others.
        service = self._service
        if service is not None and service is not _shared_service and id(service) in _started:
            del _started[id(service)]
            await service.stop()
