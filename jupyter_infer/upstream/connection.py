"""The upstream OpenAI-compatible server as this process sees it: where it is, which model it
serves, whether it answers, and streams of completions from it (with retries before the
first token).

The API key is read once, kept in the HTTP client's headers and nowhere else: it is never
logged and never part of ``describe()``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import httpx

from ..errors import InferError, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from ..values.engine_info import EngineInfo
from ..values.metrics import wall
from ..wire.upstream_openai import CallsAsText, Chunk, http_error, parse_chunk, request_body

if TYPE_CHECKING:
    from ..values.config import ServiceConfig
    from ..values.request import Request

log = logging.getLogger(__name__)

RETRY_BASE_S = 0.25  # the first retry's wait; each next one doubles
RETRY_MAX_S = 4.0
PROBE_TIMEOUT_S = 5.0  # a reachability check (GET v1/models) gives up after this
_RETRY_STATUSES = {429, 502, 503, 504}  # the upstream (or its proxy) may be back in a moment


class UpstreamConfigError(Exception):
    """The upstream settings cannot work (e.g. the API key's variable is not set)."""


class UpstreamServer:
    def __init__(self, config: ServiceConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = config.upstream_url
        self.model: str | None = config.upstream_model or None
        self.timeout_s = config.upstream_timeout_s
        self.retries = config.upstream_retries
        self.max_in_flight = config.batch_size
        self.card: dict[str, Any] = {}  # the upstream's v1/models entry for the model
        self.reachable: bool | None = None  # None: not checked yet
        self.last_error: str | None = None
        self.checked_at: float | None = None
        self._config = config
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        # A server this one started (a managed child): what to say when it does not answer, and
        # how to wait until it serves again (a restart) before a request is tried again.
        self.advice = "Check that it is running (InferApp.upstream_url)"
        self.hold: Callable[[], Awaitable[None]] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Make the HTTP client; raises ``UpstreamConfigError`` if the key's variable is unset."""
        config = self._config
        key = config.upstream_api_key
        if not key and config.upstream_api_key_env:
            key = os.environ.get(config.upstream_api_key_env, "")
            if not key:
                raise UpstreamConfigError(
                    f"InferApp.upstream_api_key_env names {config.upstream_api_key_env!r}, which is not "
                    "set in the Jupyter server's environment; set it, or set InferApp.upstream_api_key."
                )
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            # Between two chunks at most timeout_s; connecting gets less, so that a dead host
            # leaves time for a retry.
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
            # One connection per request in flight, and some for probes: never wait for the pool.
            limits=httpx.Limits(max_connections=self.max_in_flight + 4,
                                max_keepalive_connections=self.max_in_flight),
            transport=self._transport,
        )

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- what it serves ---------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        card = self.card
        max_len = card.get("max_model_len") or card.get("context_length")
        cfg = self._config
        return EngineInfo(
            engine="openai",
            model=self.model or "",
            device=self.url,
            dtype="n/a",
            # Unknown context: the limits bound a request; the upstream refuses what does not fit.
            max_context=max_len if isinstance(max_len, int) and max_len > 0
            else cfg.max_prompt_tokens + cfg.max_new_tokens,
            details={"upstream": self.describe()},
        )

    def describe(self) -> dict[str, Any]:
        """Where the upstream is and whether it answers (no credentials)."""
        return {
            "url": self.url,
            "model": self.model,
            "reachable": self.reachable,
            "last_error": self.last_error,
            "checked_at": wall(self.checked_at),
            "timeout_s": self.timeout_s,
            "max_in_flight": self.max_in_flight,
        }

    async def probe(self) -> bool:
        """Ask ``v1/models``: learns the model (the first id, unless configured) and whether
        the upstream answers. Never raises."""
        try:
            response = await self._http.get(f"{self.url}/models", timeout=min(self.timeout_s, PROBE_TIMEOUT_S))
            if response.status_code != 200:
                raise http_error(response.status_code, response.content, self.url)
            cards = [c for c in response.json().get("data") or [] if isinstance(c, dict) and c.get("id")]
        except InferError as err:
            return self._unreachable(err.message)
        except (httpx.HTTPError, ValueError, AttributeError) as err:
            return self._unreachable(_describe(err, self.url))
        if self.model is None:
            if not cards:
                return self._unreachable(f"The upstream server ({self.url}) lists no model in v1/models.")
            self.model = cards[0]["id"]
        self.card = next((c for c in cards if c["id"] == self.model), {})
        self._reached()
        return True

    # -- completions ------------------------------------------------------------------------
    async def stream(self, request: Request) -> AsyncIterator[Chunk]:
        """Stream ``request`` from the upstream, chunk by chunk.

        Before the first text arrives, an unreachable or overloaded upstream is retried
        (``upstream_retries`` times, with backoff, within ``upstream_timeout_s``); after it,
        any failure ends the request. Raises ``UpstreamUnavailable`` (503), ``UpstreamError``
        (502), ``UpstreamTimeout`` (504) or ``InvalidRequest`` (the upstream refused it).
        Closing the generator (a cancelled request) closes the upstream connection.
        """
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            sent_text = False
            try:
                if self.model is None and not await self.probe():
                    raise UpstreamUnavailable(self._down_message())
                path, body = request_body(request, self.model)
                async with aclosing(self._attempt(path, body)) as chunks:
                    async for chunk in chunks:
                        sent_text = sent_text or bool(chunk.text)
                        yield chunk
                return
            except UpstreamUnavailable as err:
                if self.hold is not None and not sent_text and attempt < max(self.retries, 3):
                    await self.hold()  # the child restarts: tried again once it serves (or its error)
                    await asyncio.sleep(RETRY_BASE_S * 2**attempt)  # (it served already: not at once)
                    attempt += 1
                    continue
                if sent_text or attempt >= self.retries:
                    raise
                wait = min(RETRY_BASE_S * 2**attempt, RETRY_MAX_S)
                if getattr(err, "retry_after", None):
                    wait = max(wait, err.retry_after)
                if time.monotonic() + wait >= deadline:
                    raise
                attempt += 1
                log.info("jupyter_infer: upstream %s: %s; retry %d in %.2f s", self.url, err.message, attempt, wait)
                await asyncio.sleep(wait)

    async def _attempt(self, path: str, body: dict[str, Any]) -> AsyncIterator[Chunk]:
        url = f"{self.url}/{path}"
        ended = False
        sent_text = False
        try:
            async with self._http.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    raw = await response.aread()
                    err = http_error(response.status_code, raw, self.url, response.headers.get("retry-after"))
                    if response.status_code in _RETRY_STATUSES and not isinstance(err, UpstreamUnavailable):
                        err = UpstreamUnavailable(err.message)  # a proxy in front of it: may pass
                    raise err
                self._reached()
                calls = CallsAsText()
                async for data in _sse_data(response):
                    chunk = parse_chunk(data, calls)
                    if chunk is None:
                        ended = True
                        break
                    ended = ended or chunk.finish_reason is not None
                    sent_text = sent_text or bool(chunk.text)
                    yield chunk
        except httpx.TimeoutException as err:
            if isinstance(err, httpx.ConnectTimeout) and not sent_text:
                raise UpstreamUnavailable(self._unreachable_error(err)) from None
            raise UpstreamTimeout(
                f"The upstream server ({self.url}) sent nothing for {self.timeout_s:g} s "
                f"({'while streaming' if sent_text else 'before the first token'}); it may be "
                "overloaded. Retry, or raise InferApp.upstream_timeout_s."
            ) from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as err:
            if not sent_text:  # nothing came yet: maybe restarting, worth another try
                raise UpstreamUnavailable(self._unreachable_error(err)) from None
            raise UpstreamError(
                f"The upstream server ({self.url}) broke the stream mid-way: {_describe(err, self.url)}"
            ) from None
        except httpx.HTTPError as err:
            raise UpstreamError(_describe(err, self.url)) from None
        if not ended:
            raise UpstreamError(
                f"The upstream server ({self.url}) closed the stream before its end (no finish_reason "
                "and no [DONE])."
            )

    # -- reachability -----------------------------------------------------------------------
    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise UpstreamUnavailable("The upstream connection is closed (the service is stopping).")
        return self._client

    def _reached(self) -> None:
        if self.reachable is False:
            log.info("jupyter_infer: the upstream server %s answers again", self.url)
        self.reachable, self.last_error, self.checked_at = True, None, time.monotonic()

    def _unreachable(self, message: str) -> bool:
        if self.reachable is not False:
            log.warning("jupyter_infer: the upstream server is not reachable: %s", message)
        self.reachable, self.last_error, self.checked_at = False, message, time.monotonic()
        return False

    def _unreachable_error(self, err: Exception) -> str:
        message = _describe(err, self.url)
        self._unreachable(message)
        return f"{message} {self.advice}; retried {self.retries} time(s)."

    def _down_message(self) -> str:
        return (f"The upstream server ({self.url}) has not answered yet, so its model is unknown: "
                f"{self.last_error or 'not checked yet'}. Check that it is running, or set "
                "InferApp.upstream_model.")


async def _sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` of each event of an SSE body (multi-line data joined by newlines)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        elif line.startswith("{"):  # a server that forgot SSE framing and sent JSON lines
            yield line
    if data:
        yield "\n".join(data)


def _describe(err: BaseException, url: str) -> str:
    kind = {
        httpx.ConnectError: "refused or could not open the connection",
        httpx.ConnectTimeout: "did not accept the connection in time",
        httpx.RemoteProtocolError: "closed the connection",
        httpx.ReadError: "broke the connection",
    }.get(type(err), type(err).__name__)
    detail = str(err).strip() or type(err).__name__
    return f"The upstream server ({url}) {kind}: {detail}."


__all__ = ["UpstreamConfigError", "UpstreamServer"]
