"""Upstream servers for the ``engine = "openai"`` and router tests, all real HTTP on loopback:

- ``ScriptedUpstream``: a small OpenAI-compatible server in the test's own event loop whose
  faults a test scripts (errors, overload, slowness, a stream broken mid-way) and which sees
  what arrives (bodies, headers) and when a client leaves;
- ``CountingProxy``: a TCP proxy that counts the connections through it, to watch a third-
  party server's connections open and close;
- ``free_port`` and ``wait_for_http``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from tornado import httpserver, web
from tornado.iostream import StreamClosedError

MODEL = "scripted-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for_http(url: str, timeout: float = 60.0, headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers 200 (a server starting in another process)."""
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(headers=headers) as client:
        while True:
            try:
                if (await client.get(url, timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout:.0f} s")
            await asyncio.sleep(0.2)


@dataclass
class ScriptedUpstream:
    """Answers ``w0 w1 w2 ...`` (one word a chunk, ``delay_s`` apart), as completions or chats.

    Faults: the next ``fail_next`` requests get ``fail_status`` with ``fail_message``;
    ``first_delay_s`` holds the first chunk back; ``drop_after`` closes the connection after
    that many chunks. It reports ``prompt_tokens`` = ``PROMPT_TOKENS`` in its usage.
    """

    port: int = field(default_factory=free_port)
    delay_s: float = 0.0
    first_delay_s: float = 0.0
    drop_after: int | None = None
    fail_next: int = 0
    fail_status: int = 503
    fail_message: str = "scripted failure"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    open_streams: int = 0
    most_open: int = 0
    disconnects: int = 0  # streams the client left before their end
    _server: httpserver.HTTPServer | None = None

    PROMPT_TOKENS = 11

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedUpstream:
        app = web.Application([
            (r"/v1/models", _Models),
            (r"/v1/completions", _Complete, {"chat": False}),
            (r"/v1/chat/completions", _Complete, {"chat": True}),
        ], upstream=self)
        self._server = httpserver.HTTPServer(app)
        self._server.listen(self.port, "127.0.0.1")
        return self

    async def stop(self) -> None:
        """Stop listening and drop open connections (a crashed upstream)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            await server.close_all_connections()


class _Models(web.RequestHandler):
    def get(self) -> None:
        self.finish({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})


class _Complete(web.RequestHandler):
    def initialize(self, chat: bool) -> None:
        self.chat = chat
        self.left = False

    def on_connection_close(self) -> None:
        self.left = True

    async def post(self) -> None:
        up: ScriptedUpstream = self.settings["upstream"]
        body = json.loads(self.request.body)
        up.bodies.append(body)
        up.headers.append(dict(self.request.headers))
        if up.fail_next > 0:
            up.fail_next -= 1
            self.set_status(up.fail_status)
            self.finish({"error": {"message": up.fail_message, "type": "server_error"}})
            return
        self.set_header("Content-Type", "text/event-stream")
        up.open_streams += 1
        up.most_open = max(up.most_open, up.open_streams)
        try:
            await self._stream(up, body)
        except StreamClosedError:
            self.left = True
        finally:
            up.open_streams -= 1
            if self.left:
                up.disconnects += 1

    async def _stream(self, up: ScriptedUpstream, body: dict[str, Any]) -> None:
        n = body.get("max_tokens") or 16
        await asyncio.sleep(up.first_delay_s)
        for i in range(n):
            if self.left:
                return
            if up.drop_after is not None and i == up.drop_after:
                self.request.connection.stream.close()
                return
            await self._send(self._chunk(f"w{i} "))
            await asyncio.sleep(up.delay_s)
        usage = {"prompt_tokens": up.PROMPT_TOKENS, "completion_tokens": n, "total_tokens": up.PROMPT_TOKENS + n}
        await self._send(self._chunk(None, "length"))
        await self._send({"choices": [], "usage": usage})
        self.write("data: [DONE]\n\n")
        self.finish()

    def _chunk(self, text: str | None, finish_reason: str | None = None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": {} if text is None else {"content": text}}
        else:
            choice = {"index": 0, "text": text or ""}
        return {"object": "chunk", "model": MODEL, "choices": [{**choice, "finish_reason": finish_reason}]}

    async def _send(self, obj: dict[str, Any]) -> None:
        self.write(f"data: {json.dumps(obj)}\n\n")
        await self.flush()


class CountingProxy:
    """A TCP proxy to ``target_port``: counts connections open now and ever, and how many
    the client side closed first."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.open = 0
        self.total = 0
        self.closed_by_client = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.open += 1
        self.total += 1

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            return True

        to_up = asyncio.ensure_future(pipe(client_r, up_w))
        to_client = asyncio.ensure_future(pipe(up_r, client_w))
        done, _ = await asyncio.wait({to_up, to_client}, return_when=asyncio.FIRST_COMPLETED)
        if to_up in done:  # the client (our front) closed its side first
            self.closed_by_client += 1
        for task in (to_up, to_client):
            task.cancel()
        for w in (up_w, client_w):
            w.close()
        self.open -= 1
