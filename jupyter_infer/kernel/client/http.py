"""The server backend: the contract's routes over HTTP (httpx), token streams over SSE (httpx-sse).

Nothing here waits forever on a silent server. A token stream's server sends a
``: keepalive`` comment every ``sse_keepalive_s`` (15 s at most) when it has nothing else to
say, so a stream that hears nothing for a few of those intervals is dead: it ends with
``ServerTimeout``. A whole answer (``infer/generate``) has no keepalives, so while it waits
the client asks ``infer/status`` now and then; a server that does not answer that either is
frozen, and the call ends with ``ServerTimeout`` too. Small reads (status, metrics, batches,
cancel) have a short timeout of their own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from ...errors import (
    EngineUnavailable,
    InferError,
    InvalidRequest,
    PayloadTooLarge,
    QueueFull,
    RequestFailed,
    ServerTimeout,
)
from .backend import Accepted, Final, Fragment, StreamItem

DEFAULT_KEEPALIVE_S = 15.0  # the server's default (and largest) sse_keepalive_s
KEEPALIVES_BEFORE_TIMEOUT = 3  # silence for this many keepalive intervals = the server is gone
VIEW_TIMEOUT_S = 10.0  # status, metrics, batches, cancel
CONNECT_TIMEOUT_S = 10.0

_ERRORS: dict[int, type[InferError]] = {
    400: InvalidRequest, 413: PayloadTooLarge, 429: QueueFull, 503: EngineUnavailable, 500: RequestFailed,
}


def error_from_response(status: int, body: bytes, url: str, headers: Any = None) -> InferError:
    """The ``InferError`` for an error answer, with the server's message, or one that says
    what to do when the body has none."""
    message = server_message(body)
    retry_after = _retry_after(headers)
    if status in (401, 403):
        message = (
            f"The server at {url} refused this request ({status}): set JUPYTER_INFER_TOKEN or pass "
            "Client(token=...) with the server's token. " + message
        ).strip()
    elif status == 404 and not message:
        message = f"{url} has no such route ({status}): is the jupyter_infer server extension enabled?"
    elif status == 429 and not message:
        message = (f"The server at {url} is busy: its queue is full (429). Retry in {retry_after:g} s, "
                   "send fewer requests at once, or raise InferApp.max_queue_size on the server.")
    elif not message:
        message = f"The server at {url} answered {status} with no message; see the server's log."
    if status == 429:
        err: InferError = QueueFull(message, retry_after=retry_after)
    else:
        err = _ERRORS.get(status, InferError)(message)
    err.status = status
    return err


def server_message(body: bytes) -> str:
    """The ``message`` of a JSON error body (ours or OpenAI's), or short plain text; "" if none."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
        return "" if text.startswith("<") else text[:300]  # an HTML error page says nothing useful
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    message = data.get("message") or (error.get("message") if isinstance(error, dict) else "")
    return message if isinstance(message, str) else ""


def _retry_after(headers: Any) -> float:
    try:
        return max(float(headers.get("Retry-After")), 0.0)
    except (AttributeError, TypeError, ValueError):
        return 1.0


class HTTPBackend:
    """``Backend`` for a running server: ``url`` ends with ``/``; ``token`` is Jupyter's.

    ``timeout``: the longest a whole ``generate`` may take. ``read_timeout``: the longest
    silence on a stream, and between liveness checks while a ``generate`` waits; default
    three of the server's keepalive intervals (45 s unless its status says otherwise).
    """

    def __init__(self, url: str, token: str | None, timeout: float = 300.0,
                 read_timeout: float | None = None) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self._read_timeout = read_timeout
        self.keepalive_s = DEFAULT_KEEPALIVE_S
        self._http: httpx.AsyncClient | None = None

    @property
    def read_timeout(self) -> float:
        if self._read_timeout is not None:
            return self._read_timeout
        return KEEPALIVES_BEFORE_TIMEOUT * self.keepalive_s

    @property
    def view_timeout(self) -> float:
        """The longest wait for a small answer (status, metrics, batches, cancel)."""
        return min(self.read_timeout, VIEW_TIMEOUT_S)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"token {self.token}"} if self.token else {}
            self._http = httpx.AsyncClient(
                base_url=self.url, headers=headers,
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
        return self._http

    def _timed_out(self, what: str, seconds: float) -> ServerTimeout:
        return ServerTimeout(
            f"The server at {self.url} sent nothing for {seconds:g} s ({what}): it may be frozen, "
            "overloaded or gone. Check that the Jupyter server still runs, then retry; "
            "Client(timeout=..., read_timeout=...) sets how long to wait."
        )

    async def _request(self, method: str, path: str, *, timeout: httpx.Timeout | None = None,
                       **kwargs: Any) -> Any:
        timeout = timeout or httpx.Timeout(self.view_timeout, connect=CONNECT_TIMEOUT_S)
        try:
            resp = await self._client().request(method, path, timeout=timeout, **kwargs)
        except httpx.TimeoutException:
            raise self._timed_out(f"{method} {path}", timeout.read or self.view_timeout) from None
        except httpx.HTTPError as err:
            raise EngineUnavailable(
                f"Cannot reach the inference server at {self.url}: {type(err).__name__}: {err}. "
                "Is the Jupyter server still running?"
            ) from None
        if resp.status_code >= 400:
            raise error_from_response(resp.status_code, resp.content, self.url, resp.headers)
        return resp.json()

    # -- generating ----------------------------------------------------------------------------
    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = asyncio.ensure_future(self._request(
            "POST", "infer/generate", json=body, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)))
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                wait = min(self.read_timeout, deadline - time.monotonic())
                done, _ = await asyncio.wait({answer}, timeout=max(wait, 0))
                if done:
                    return answer.result()
                if time.monotonic() >= deadline:
                    raise ServerTimeout(
                        f"No answer from {self.url} within {self.timeout:g} s (Client(timeout=...)). "
                        "Ask for fewer tokens, or stream the answer with client.stream(...)."
                    )
                await self._check_alive()
        finally:
            if not answer.done():
                answer.cancel()  # closes the connection: the server cancels the request
                await asyncio.gather(answer, return_exceptions=True)

    async def _check_alive(self) -> None:
        """Raise ``ServerTimeout`` if the server does not answer ``infer/status`` in time."""
        try:
            await self._request("GET", "infer/status")
        except ServerTimeout:
            raise self._timed_out("waiting for a whole answer, and no status either",
                                  self.read_timeout) from None

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[StreamItem]:
        # httpx's read timeout is per read: each keepalive comment restarts it.
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=self.read_timeout, pool=None)
        try:
            async with aconnect_sse(self._client(), "POST", "infer/generate_stream", json=body,
                                    timeout=timeout) as source:
                resp = source.response
                if resp.status_code >= 400:
                    raise error_from_response(resp.status_code, await resp.aread(), self.url, resp.headers)
                if resp.headers.get("X-Request-Id"):
                    yield Accepted(resp.headers["X-Request-Id"])
                async for event in source.aiter_sse():
                    if event.event == "token":
                        yield Fragment(event.id, event.data)
                    elif event.event == "result":
                        yield Final(json.loads(event.data))
                    elif event.event == "done":
                        return
                    elif event.event == "error":
                        raise RequestFailed(_event_message(event.data))
                raise RequestFailed("The stream ended before its 'done' event: the server closed it.")
        except httpx.TimeoutException:
            raise self._timed_out("on a token stream", self.read_timeout) from None
        except httpx.HTTPError as err:
            raise EngineUnavailable(f"Lost the stream from {self.url}: {type(err).__name__}: {err}.") from None

    # -- views and control ---------------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        status = await self._request("GET", "infer/status")
        self._note_keepalive(status)
        return status

    def _note_keepalive(self, status: dict[str, Any]) -> None:
        limits = status.get("limits") if isinstance(status.get("limits"), dict) else {}
        value = limits.get("sse_keepalive_s", status.get("sse_keepalive_s"))
        if isinstance(value, (int, float)) and value > 0:
            self.keepalive_s = float(value)

    async def metrics(self) -> dict[str, Any]:
        return await self._request("GET", "infer/metrics")

    async def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        params = {"limit": limit} if requests is None else {"limit": limit, "requests": requests}
        return await self._request("GET", "infer/batches", params=params)

    async def models(self, method: str = "GET", body: dict[str, Any] | None = None) -> dict[str, Any]:
        # A load answers once the model is ready: as long as a generation may take.
        timeout = None if method == "GET" else httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        return await self._request(method, "infer/models", timeout=timeout,
                                   **({"json": body} if body is not None else {}))

    async def cancel(self, request_id: str) -> bool:
        try:
            resp = await self._client().delete(f"infer/requests/{request_id}", timeout=self.view_timeout)
        except httpx.TimeoutException:
            raise self._timed_out(f"DELETE infer/requests/{request_id}", self.view_timeout) from None
        except httpx.HTTPError as err:
            raise EngineUnavailable(f"Cannot reach the inference server at {self.url}: {err}.") from None
        if resp.status_code == 404 and server_message(resp.content):
            return False  # the server knows no such request in flight (finished, or never was)
        if resp.status_code == 404:
            raise InferError(f"The server at {self.url} cannot cancel one request (no DELETE "
                             "infer/requests/{id} route): update jupyter_infer on the server.")
        if resp.status_code >= 400:
            raise error_from_response(resp.status_code, resp.content, self.url, resp.headers)
        return bool(resp.json().get("cancelled", True))

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = await self.status()
            if status.get("state") == "ready":
                return status
            if status.get("state") == "failed":
                raise EngineUnavailable(f"The engine failed to load: {status.get('load_error')}")
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"The engine is still {status.get('state')} after {timeout:.0f} s.")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _event_message(data: str) -> str:
    try:
        message = json.loads(data).get("message")
    except (ValueError, AttributeError):
        return data
    return message if isinstance(message, str) and message else data
