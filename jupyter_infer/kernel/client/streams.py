"""Token streams: ``for fragment in client.stream(prompt)`` and ``async for ... in client.astream(prompt)``.

A stream's request runs in one task of its own on the client's I/O loop (its *feed*): that
task alone iterates the backend's async generator and hands what arrives to a queue, and it
alone closes the generator, when the request ends or the stream is cancelled. Readers on
any thread or loop only take from the queue. So a generator is never closed while another
task is inside it (``aclose(): asynchronous generator is already running``), and every
error reaches the reader instead of a "Task exception was never retrieved" log line.

Leaving a stream early (``break`` then ``close``/``aclose``, a cancelled reader, or simply
dropping the stream) cancels the feed, which closes the connection (or the embedded
request): the server frees the slot at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ...errors import InferError
from .backend import Accepted, Final, Fragment, StreamItem
from .io_thread import IOThread
from .results import Completion

_END = object()


class _Feed:
    """The I/O-loop side of one stream: a task that moves the backend's items into a queue.

    Holds no reference to the stream object, so a dropped stream can be collected (and its
    finalizer cancel this feed)."""

    def __init__(self, io: IOThread, source: Callable[[], AsyncIterator[StreamItem]]) -> None:
        self.io = io
        self._source = source
        self._queue: asyncio.Queue[tuple[Any, float]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False

    def _start(self) -> asyncio.Queue[tuple[Any, float]]:
        if self._queue is None:
            self._queue = asyncio.Queue()
            if self._cancelled:
                self._queue.put_nowait((_END, time.time()))
            else:
                self._task = asyncio.get_running_loop().create_task(self._run(self._queue))
        return self._queue

    async def _run(self, queue: asyncio.Queue[tuple[Any, float]]) -> None:
        items = self._source()
        try:
            async for item in items:
                queue.put_nowait((item, time.time()))
        except InferError as err:
            queue.put_nowait((err, time.time()))  # the reader raises it
            return
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug, not a request error: still the reader's to see
            queue.put_nowait((err, time.time()))
            return
        finally:
            await items.aclose()  # on this task, the only one that ever iterates it
        queue.put_nowait((_END, time.time()))

    async def take(self) -> list[tuple[Any, float]]:
        """Everything that arrived since the last call (waits for at least one item)."""
        queue = self._start()
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        return items

    async def aclose(self) -> None:
        """Cancel the request (if still running) and wait until its connection is closed."""
        self._cancel()
        task = self._task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    def cancel(self) -> None:
        """``aclose`` without waiting, from any thread."""
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing runs
            self.io.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        # On the loop, like _start: a feed that has not started yet never will. Only once: a
        # second cancel would interrupt the first one's cleanup (closing the connection, which
        # is what tells the server to stop), and leave the request running.
        if self._cancelled:
            return
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()


class _StreamState:
    """What a stream learned so far: request id, text, client-side times (epoch seconds)."""

    def __init__(self, io: IOThread, prompt: str, source: Callable[[], AsyncIterator[StreamItem]]) -> None:
        self.prompt = prompt
        self.id: str | None = None
        self.text = ""
        self.fragments = 0
        self.sent_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.error: str | None = None
        self._ended = False  # the backend said the request is over (not closed early)
        self._final: dict[str, Any] | None = None
        self._io = io
        self._feed = _Feed(io, source)
        self._pending: list[tuple[Any, float]] = []
        weakref.finalize(self, self._feed.cancel)  # dropped unfinished: the request is cancelled

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first fragment, as this client saw it."""
        if self.sent_at is None or self.first_token_at is None:
            return None
        return (self.first_token_at - self.sent_at) * 1000

    @property
    def total_ms(self) -> float | None:
        if self.sent_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.sent_at) * 1000

    @property
    def completion(self) -> Completion | None:
        """The finished request (``None`` until the stream has ended normally).

        From the server's final result: its ``completion_tokens``, batch and timings. From an
        older server that sends none: the fragments counted and the client's own times, with
        ``counted_fragments`` set.
        """
        if not self._ended:
            return None
        extra = {"prompt": self.prompt, "sent_at": self.sent_at, "received_at": self.finished_at}
        if self._final is not None:
            return Completion.from_json(self._final, **extra)
        return Completion(self.id, self.text, "", completion_tokens=self.fragments, ttft_ms=self.ttft_ms,
                          total_ms=self.total_ms, counted_fragments=True, **extra)

    @property
    def tokens(self) -> int:
        """Tokens generated: the server's count once it sent it, else the fragments so far."""
        if self._final is not None:
            return int((self._final.get("usage") or {}).get("completion_tokens", self.fragments))
        return self.fragments

    def _claim(self) -> None:
        if self.sent_at is not None:
            raise RuntimeError("A token stream can be read once; call client.stream(...) again for a new request.")
        self.sent_at = time.time()

    def _next(self) -> str | None:
        """Apply pending items up to the next fragment and return it; ``None`` when more must
        be taken; raise ``StopAsyncIteration`` at the end or the request's error."""
        while self._pending:
            item, at = self._pending.pop(0)
            if isinstance(item, Fragment):
                if self.first_token_at is None:
                    self.first_token_at = at
                self.id = self.id or item.request_id
                self.text += item.text
                self.fragments += 1
                return item.text
            if isinstance(item, Accepted):
                self.id = item.request_id
            elif isinstance(item, Final):
                self._final = item.data
                self.id = self.id or item.data.get("id")
            elif item is _END:
                self.finished_at, self._ended = at, True
                raise StopAsyncIteration
            elif isinstance(item, BaseException):
                self.finished_at = at
                self.error = item.message if isinstance(item, InferError) else f"{type(item).__name__}: {item}"
                raise item
        return None


class AsyncTokenStream(_StreamState):
    """``async for fragment in client.astream(prompt)``; ``.id``, ``.text``, ``.completion``
    and times after. Awaitable from any event loop."""

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> str:
        if self.sent_at is None:
            self._claim()
        while True:
            if self.done:
                raise StopAsyncIteration
            fragment = self._next()
            if fragment is not None:
                return fragment
            try:
                self._pending = await self._io.call(self._feed.take())
            except asyncio.CancelledError:
                self._feed.cancel()  # the reader was cancelled: so is the request
                raise

    async def aclose(self) -> None:
        """Stop early: the server cancels the request and frees its slot."""
        await self._io.call(self._feed.aclose())
        if not self.done:
            self.finished_at = time.time()


class TokenStream(_StreamState):
    """``for fragment in client.stream(prompt)``; ``.id``, ``.text``, ``.completion`` and times after."""

    def __iter__(self) -> Iterator[str]:
        self._claim()
        return self._iterate()

    def _iterate(self) -> Iterator[str]:
        try:
            while True:
                try:
                    fragment = self._next()
                except StopAsyncIteration:
                    return
                if fragment is not None:
                    yield fragment
                else:
                    self._pending = self._io.run(self._feed.take())
        finally:
            if not self.done:  # left early (break, or Ctrl-C): cancel the request
                self.close()

    def close(self) -> None:
        """Stop early: the server cancels the request and frees its slot."""
        if self._io.is_current:
            self._feed.cancel()
        else:
            self._io.run(self._feed.aclose())
        if not self.done:
            self.finished_at = time.time()
