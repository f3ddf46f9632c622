"""The client's own event loop, in a daemon thread shared by every client of the process.

A sync call submits a coroutine to this loop and blocks on its future; an async call awaits
the same future through ``asyncio.wrap_future``. So the sync API never needs the caller's
loop: it works from plain scripts, inside ipykernel 7's running loop (where ``asyncio.run``
fails), and inside ``async def`` code alike, without patching asyncio (nest-asyncio is
archived and breaks cells on ipykernel >= 7). An embedded engine lives on this loop too, so
it keeps serving between cells.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
THREAD_NAME = "jupyter-infer-io"


class IOThread:
    """One event loop in a daemon thread; all of the process's clients run their I/O here."""

    _instance: IOThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name=THREAD_NAME, daemon=True)
        self.thread.start()
        ready.wait()

    @classmethod
    def get(cls) -> IOThread:
        """The process's I/O thread, started on first use (again if it died)."""
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
                atexit.register(cls._instance.shutdown)
            return cls._instance

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    @property
    def is_current(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.current_thread() is self.thread

    def at_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook()`` on the loop when the process exits (e.g. to stop an embedded engine)."""
        if hook not in self._shutdown_hooks:
            self._shutdown_hooks.append(hook)

    def shutdown(self, timeout: float = 3.0) -> None:
        """Run the shutdown hooks, cancel what is left and stop the loop (at interpreter exit)."""

        async def stop_all() -> None:
            for hook in self._shutdown_hooks:
                with contextlib.suppress(Exception):
                    await hook()
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if not self.thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self.submit(stop_all()).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the loop; return at once with a ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it ends (Ctrl-C cancels it)."""
        if self.is_current:
            coro.close()
            raise RuntimeError("jupyter_infer: a sync client call cannot run on the client's own I/O thread; "
                               "await the async API (agenerate, astream, ...) there instead.")
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt (kernel interrupt): stop the work
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` from any loop, running it on this one."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))
