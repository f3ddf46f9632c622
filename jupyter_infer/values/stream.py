"""What a caller holds for one request: its tokens as they come, then its result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from .metrics import RequestRecord
from .request import RequestResult, TokenEvent


class _End:
    """Marks the end of a request's token stream."""


class RequestStream:
    """Iterate for ``TokenEvent``s, await ``result()``; leaving early cancels the request."""

    def __init__(self, request_id: str, cancel: Callable[[str], object], prompt_ids: list[int] | None = None) -> None:
        self.id = request_id
        self.prompt_ids: list[int] = prompt_ids or []  # the tokens the request runs on
        self.model: str | None = None  # the model that serves it (the service fills it in)
        self.route: str | None = None  # the router's backend that serves it
        self.tool_format = "hermes"  # how its answer writes tool calls (constraints/tool_formats)
        # Its record in the service's metrics, read (never written) for the access log's tokens.
        self.record: RequestRecord | None = None
        self._cancel = cancel
        self._events: asyncio.Queue[TokenEvent | _End] = asyncio.Queue()
        self._result: asyncio.Future[RequestResult] = asyncio.get_running_loop().create_future()

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
        """The final result; raises the ``InferError`` the request failed with."""
        return await asyncio.shield(self._result)

    def cancel(self) -> None:
        self._cancel(self.id)

    def follow(self, inner: RequestStream, route: str | None) -> None:
        """A router's stream: what the backend's stream (``inner``, on ``route``) knows of
        the request, as the backend's loop set it."""
        self.route, self.model, self.tool_format, self.record = route, inner.model, inner.tool_format, inner.record
        self.prompt_ids = inner.prompt_ids

    # -- called by the engine loop ----------------------------------------------------------
    def push(self, event: TokenEvent) -> None:
        self._events.put_nowait(event)

    def finish(self, result: RequestResult | None = None, error: BaseException | None = None) -> None:
        if self._result.done():
            return
        if error is not None:
            self._result.set_exception(error)
            self._result.exception()  # mark retrieved: a stream nobody awaits must not warn
        else:
            self._result.set_result(result)
        self._events.put_nowait(_End())
