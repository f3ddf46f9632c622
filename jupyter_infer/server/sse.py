"""Server-Sent Events: the wire format, and a handler base that streams and notices leavers.

Each event is a block of ``field: value`` lines ended by a blank line. A value with line
breaks becomes several ``data:`` lines, which a spec-compliant parser joins back with ``\\n``
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jupyter_server.base.handlers import APIHandler
from tornado.iostream import StreamClosedError

from ..errors import InferError
from ..values.request import RequestResult, TokenEvent
from ..values.stream import RequestStream

T = TypeVar("T")

# The SSE spec ends a line at CRLF, CR or LF; any of them inside a value starts a new data line.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
KEEPALIVE = ": keepalive\n\n"


def format_event(data: str, event: str | None = None, id: str | None = None) -> str:
    """One SSE event. ``data`` may hold line breaks; ``event`` and ``id`` must not."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(data))
    return "\n".join(lines) + "\n\n"


def format_comment(text: str) -> str:
    """A comment line: clients ignore it; it keeps proxies and idle timers from closing us."""
    return f": {_LINE_BREAK.sub(' ', text)}\n\n"


class EventStreamHandler(APIHandler):
    """An ``APIHandler`` whose answers may be ``text/event-stream``.

    ``start_event_stream`` sends the headers at once; ``send`` writes and flushes, and
    returns False when the client has gone. ``relay`` writes the tokens of one or several
    requests as they come, with keepalive comments in the gaps, and cancels the requests if
    the client leaves.
    """

    keepalive_s: float = 15.0

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.gone = asyncio.Event()
        self.streaming = False
        self.request_streams: list[RequestStream] = []  # cancelled if the client leaves

    def on_connection_close(self) -> None:
        self.gone.set()
        for stream in self.request_streams:
            if not stream.done:
                stream.cancel()  # the slot frees at the next step
        super().on_connection_close()

    def start_event_stream(self, comment: str = "ok") -> None:
        self.set_status(200)
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # nginx: pass each event through
        self.streaming = True
        self.write(format_comment(comment))

    async def send(self, text: str) -> bool:
        """Write ``text`` and flush it; False if the client is gone."""
        if self.gone.is_set():
            return False
        try:
            self.write(text)
            await self.flush()
        except StreamClosedError:
            self.gone.set()
            return False
        return True

    async def next_or_keepalive(self, awaitable: Awaitable[T]) -> T | None:
        """Await ``awaitable``, sending a keepalive comment every ``keepalive_s`` meanwhile;
        ``None`` if the client leaves first."""
        task = asyncio.ensure_future(awaitable)
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {task, gone}, timeout=self.keepalive_s, return_when=asyncio.FIRST_COMPLETED
                )
                if task in done:
                    return task.result()
                if gone in done or not await self.send(KEEPALIVE):
                    task.cancel()
                    return None
        finally:
            gone.cancel()

    async def relay(
        self, streams: list[RequestStream], render: Callable[[int, TokenEvent | RequestResult], str]
    ) -> list[RequestResult] | InferError | None:
        """Write ``render(i, event)`` for each token event of ``streams[i]`` as it comes
        (the streams interleave), and ``render(i, result)`` as each one ends.

        Returns the results in order, the first error a request ended with (the others are
        then cancelled), or ``None`` if the client left (every request is then cancelled).
        """
        queue: asyncio.Queue[tuple[int, TokenEvent | RequestResult | InferError]] = asyncio.Queue()

        async def pump(i: int, stream: RequestStream) -> None:
            try:
                async for event in stream:
                    queue.put_nowait((i, event))
                queue.put_nowait((i, await stream.result()))
            except InferError as err:
                queue.put_nowait((i, err))

        pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        results: list[RequestResult | None] = [None] * len(streams)
        try:
            remaining = len(streams)
            while remaining:
                item = await self.next_or_keepalive(queue.get())
                if item is None:
                    return None
                i, event = item
                if isinstance(event, InferError):
                    return event
                if isinstance(event, RequestResult):
                    results[i] = event
                    remaining -= 1
                text = render(i, event)
                if text and not await self.send(text):
                    return None
            return results  # type: ignore[return-value]
        finally:
            for task in pumps:
                task.cancel()
            for stream in streams:
                if not stream.done:
                    stream.cancel()

    def finish_event_stream(self) -> None:
        if not self._finished:
            try:
                super().finish(set_content_type="text/event-stream; charset=utf-8")
            except StreamClosedError:
                pass
