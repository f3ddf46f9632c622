"""For the client tests: a fast embedded engine, and a scripted HTTP server that answers
(or falls silent) exactly as a test needs, on a loop in a thread of its own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig

Script = Callable[[str, str, asyncio.StreamWriter], Awaitable[None]]


def fast_service(delay_ms: tuple[float, float] = (1.0, 3.0)) -> InferenceService:
    """An embedded simulated engine with ``delay_ms`` between tokens."""
    return InferenceService(ServiceConfig(engine="simulated", simulated_token_delay_ms=delay_ms))


class ScriptedServer:
    """``with ScriptedServer(script) as server: server.url``. ``script(method, path, writer)``
    writes the answer to each request (or writes nothing and waits: a frozen server)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="scripted-server", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handlers.add(asyncio.current_task())
        try:
            while True:  # keep-alive: one request after another on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                await reader.readexactly(int(headers.get("content-length", headers.get("Content-Length", 0))))
                self.requests.append((method, path))
                await self.script(method, path, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(asyncio.current_task())
            writer.close()


def answer(writer: asyncio.StreamWriter, status: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    """Write a whole HTTP/1.1 answer."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def answer_json(writer: asyncio.StreamWriter, data: Any, status: str = "200 OK") -> None:
    answer(writer, status, json.dumps(data).encode(), {"Content-Type": "application/json"})


def start_event_stream(writer: asyncio.StreamWriter, request_id: str = "req-1") -> None:
    """The headers of an SSE answer (closed-delimited body), and the server's first comment."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nConnection: close\r\n"
        + f"X-Request-Id: {request_id}\r\n\r\n: ok\n\n".encode()
    )


def sse(data: str, event: str, request_id: str = "req-1") -> bytes:
    return f"event: {event}\nid: {request_id}\n".encode() + "".join(
        f"data: {line}\n" for line in data.split("\n")).encode() + b"\n"
