"""``jupyter_infer.Client``: the kernel side's way to the inference engine, sync and async.

Where the engine is, in this order:

1. ``Client(url=..., token=...)``, explicitly;
2. the environment: ``JUPYTER_INFER_URL`` and ``JUPYTER_INFER_TOKEN``;
3. the Jupyter server that runs this kernel: among the servers that
   ``jupyter_server.serverapp.list_running_servers()`` lists, the one whose process is this
   kernel's parent (``JPY_PARENT_PID``), or else the one whose ``api/kernels`` lists this
   kernel's id (from its connection file);
4. otherwise an engine inside this process (*embedded* mode), with a note saying so.

How the sync API works inside a Jupyter cell: every request runs on one private event loop
in a daemon thread (``jupyter-infer-io``), shared by all clients of the process. A sync call
submits a coroutine to that loop and blocks on its future; an async call awaits the same
future through ``asyncio.wrap_future``. So the sync API never needs the caller's loop: it
works from plain scripts, inside ipykernel 7's running loop (where ``asyncio.run`` fails),
and inside ``async def`` code alike, without patching asyncio (nest-asyncio is archived and
breaks cells on ipykernel >= 7). The embedded engine lives on that loop too, so it keeps
serving between cells.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import (
    EngineUnavailable,
    InferError,
    InvalidRequest,
    PayloadTooLarge,
    QueueFull,
    RequestFailed,
)

if TYPE_CHECKING:
    from .service import InferenceService

__all__ = ["Client", "Completion", "TokenStream", "AsyncTokenStream", "Connection", "discover"]

ENV_URL = "JUPYTER_INFER_URL"
ENV_TOKEN = "JUPYTER_INFER_TOKEN"
T = TypeVar("T")


# -- results ----------------------------------------------------------------------------------
@dataclass
class Completion:
    """One finished request: the JSON of ``POST infer/generate`` plus client-side times.

    ``sent_at``/``received_at`` are wall-clock epoch seconds seen by the client. A request
    that failed inside a ``burst`` has ``finish_reason == "error"`` and ``error`` set.
    """

    id: str | None
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_id: int | None = None
    batch_size: int = 0
    queued_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt: str | None = None
    sent_at: float | None = None
    received_at: float | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], **extra: Any) -> Completion:
        usage = data.get("usage") or {}
        batch = data.get("batch") or {}
        timings = data.get("timings") or {}
        return cls(
            id=data.get("id"),
            text=data.get("text", ""),
            finish_reason=data.get("finish_reason", ""),
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            batch_id=batch.get("id"),
            batch_size=batch.get("size", 0),
            queued_ms=timings.get("queued_ms"),
            ttft_ms=timings.get("ttft_ms"),
            total_ms=timings.get("total_ms"),
            **extra,
        )

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The contract's shape (``infer/generate``), plus the client-side fields."""
        return {
            "id": self.id,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
            "batch": {"id": self.batch_id, "size": self.batch_size},
            "timings": {"queued_ms": self.queued_ms, "ttft_ms": self.ttft_ms, "total_ms": self.total_ms},
            "prompt": self.prompt,
            "sent_at": self.sent_at,
            "received_at": self.received_at,
            "error": self.error,
        }

    def __str__(self) -> str:
        return self.text


# -- the private loop -------------------------------------------------------------------------
class _IOThread:
    """One event loop in a daemon thread; all of the process's clients run their I/O here."""

    _instance: _IOThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name="jupyter-infer-io", daemon=True)
        self.thread.start()
        ready.wait()

    @classmethod
    def get(cls) -> _IOThread:
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
                atexit.register(cls._instance.shutdown)
            return cls._instance

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    def shutdown(self, timeout: float = 3.0) -> None:
        """Stop embedded engines and the loop (at interpreter exit), so nothing is left pending."""

        async def stop_all() -> None:
            for service in list(_started_services.values()):
                await service.stop()
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if not self.thread.is_alive():
            return
        try:
            self.submit(stop_all()).result(timeout)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and block until it ends (Ctrl-C cancels it)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("jupyter_infer: a sync client call cannot run on the client's own I/O thread.")
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt (kernel interrupt) or a timeout: stop the work
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` from any loop, running it on the private loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))


# -- discovery --------------------------------------------------------------------------------
@dataclass
class Connection:
    """Where a client sends its requests, and how that was decided."""

    backend: str  # "server" | "embedded"
    source: str  # "explicit" | "environment" | "kernel's server" | "embedded"
    url: str | None = None
    token: str | None = None
    note: str | None = None

    def __str__(self) -> str:
        if self.backend == "server":
            return f"server {self.url} (found via {self.source})"
        return "embedded engine in this process"


def _normalize_url(url: str) -> str:
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/") else url + "/"


def _get_json(url: str, token: str | None, timeout: float = 3.0) -> Any:
    headers = {"Authorization": f"token {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
        return json.loads(resp.read())


def _answers(url: str, token: str | None) -> str | None:
    """``None`` if ``infer/status`` answers at ``url``; otherwise why not."""
    try:
        _get_json(url + "infer/status", token)
        return None
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return f"{url} has no infer/ routes (is the jupyter_infer server extension enabled?)"
        if err.code in (401, 403):
            return f"{url} refused the token ({err.code})"
        return f"{url} answered {err.code}"
    except (OSError, ValueError) as err:
        return f"{url} did not answer ({err})"


def _kernel_id() -> str | None:
    """This kernel's id, from its connection file name (``kernel-<id>.json``)."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:
        return None
    if name.startswith("kernel-") and name.endswith(".json"):
        return name[len("kernel-") : -len(".json")]
    return None


def _running_servers() -> list[dict[str, Any]]:
    try:
        from jupyter_server.serverapp import list_running_servers

        return list(list_running_servers())
    except Exception:
        return []


def find_kernel_server(
    servers: Iterable[dict[str, Any]] | None = None,
    *,
    parent_pid: int | None = None,
    kernel_id: str | None = None,
) -> dict[str, Any] | None:
    """The running Jupyter server that started this kernel, or ``None``.

    First the server whose pid is the kernel's parent (jupyter_client sets ``JPY_PARENT_PID``);
    then, for kernels behind a provisioner or a wrapper, the server whose ``api/kernels`` lists
    this kernel's id. Any other server is not this kernel's, and is never picked.
    """
    servers = _running_servers() if servers is None else list(servers)
    if not servers:
        return None
    if parent_pid is None:
        try:
            parent_pid = int(os.environ.get("JPY_PARENT_PID") or os.getppid())
        except ValueError:
            parent_pid = os.getppid()
    for info in servers:
        if info.get("pid") in (parent_pid, os.getppid()):
            return info
    kernel_id = kernel_id or _kernel_id()
    if kernel_id is None:
        return None
    for info in servers:
        url = _normalize_url(info.get("url", ""))
        try:
            kernels = _get_json(url + "api/kernels", info.get("token"), timeout=2.0)
        except (OSError, ValueError):
            continue
        if any(k.get("id") == kernel_id for k in kernels):
            return info
    return None


def discover(url: str | None = None, token: str | None = None) -> Connection:
    """Decide where requests go (see the module docstring); probes ``infer/status``."""
    if url:
        return Connection("server", "explicit", _normalize_url(url), token or os.environ.get(ENV_TOKEN))
    notes: list[str] = []
    env_url = os.environ.get(ENV_URL)
    if env_url:
        conn = Connection("server", "environment", _normalize_url(env_url), token or os.environ.get(ENV_TOKEN))
        why = _answers(conn.url, conn.token)
        if why is None:
            return conn
        notes.append(f"{ENV_URL}: {why}")
    info = find_kernel_server()
    if info is not None:
        conn = Connection("server", "kernel's server", _normalize_url(info["url"]), token or info.get("token"))
        why = _answers(conn.url, conn.token)
        if why is None:
            return conn
        notes.append(f"this kernel's server: {why}")
    else:
        notes.append("no Jupyter server runs this kernel")
    note = (
        "jupyter_infer: no inference server found ("
        + "; ".join(notes)
        + "); running an embedded engine inside this process instead. Set JUPYTER_INFER_URL "
        "and JUPYTER_INFER_TOKEN, or pass Client(url=..., token=...), to use a server."
    )
    return Connection("embedded", "embedded", note=note)


# -- backends (their coroutines always run on the private loop) -------------------------------
_ERRORS: dict[int, type[InferError]] = {
    400: InvalidRequest, 413: PayloadTooLarge, 429: QueueFull, 503: EngineUnavailable, 500: RequestFailed,
}


def _error_from_response(status: int, body: bytes, url: str) -> InferError:
    message = ""
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            error = data.get("error")
            message = data.get("message") or (error.get("message") if isinstance(error, dict) else "") or ""
    except ValueError:
        message = body.decode(errors="replace")[:300]
    if status in (401, 403):
        message = (
            f"The server at {url} refused this request ({status}): set JUPYTER_INFER_TOKEN or pass "
            "Client(token=...) with the server's token. " + message
        ).strip()
    elif status == 404:
        message = f"{url} has no such route ({status}): is the jupyter_infer server extension enabled? " + message
    cls = _ERRORS.get(status, InferError)
    err = cls(message or f"The server answered {status}.") if cls is not QueueFull else QueueFull(message)
    err.status = status
    return err


class _SSE:
    """A spec-compliant parser for ``text/event-stream`` lines."""

    def __init__(self) -> None:
        self.event = ""
        self.id = ""
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, str, str] | None:
        """Feed one line (without its end); return ``(event, id, data)`` when one is complete."""
        if line == "":
            if not self.data and not self.event:
                return None
            out = (self.event or "message", self.id, "\n".join(self.data))
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id" and "\0" not in value:
            self.id = value
        return None


class _ServerBackend:
    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self._http: Any = None

    def _client(self) -> Any:
        if self._http is None:
            import httpx

            headers = {"Authorization": f"token {self.token}"} if self.token else {}
            self._http = httpx.AsyncClient(
                base_url=self.url, headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=10.0),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
        return self._http

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            resp = await self._client().request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise EngineUnavailable(
                f"Cannot reach the inference server at {self.url}: {type(err).__name__}: {err}. "
                "Is the Jupyter server still running?"
            ) from None
        if resp.status_code >= 400:
            raise _error_from_response(resp.status_code, resp.content, self.url)
        return resp.json()

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", "infer/generate", json=body)

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[tuple[str, str]]:
        import httpx

        try:
            async with self._client().stream(
                "POST", "infer/generate_stream", json=body, timeout=httpx.Timeout(None, connect=10.0)
            ) as resp:
                if resp.status_code >= 400:
                    raise _error_from_response(resp.status_code, await resp.aread(), self.url)
                parser = _SSE()
                async for line in resp.aiter_lines():
                    event = parser.feed(line)
                    if event is None:
                        continue
                    kind, request_id, data = event
                    if kind == "token":
                        yield request_id, data
                    elif kind == "done":
                        return
                    elif kind == "error":
                        try:
                            message = json.loads(data).get("message", data)
                        except (ValueError, AttributeError):
                            message = data
                        raise RequestFailed(message)
                raise RequestFailed("The stream ended before its 'done' event: the server closed it.")
        except httpx.HTTPError as err:
            raise EngineUnavailable(
                f"Lost the stream from {self.url}: {type(err).__name__}: {err}."
            ) from None

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return await self._request("GET", path, params=params)

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = await self.get("infer/status")
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


_shared_service: InferenceService | None = None
_started_services: dict[int, InferenceService] = {}  # by id(): services compare by value


def make_embedded_service() -> InferenceService:
    """The engine embedded mode uses: the server's defaults (``auto`` engine, continuous)."""
    from .service import InferenceService

    return InferenceService()


class _EmbeddedBackend:
    url = None
    token = None

    def __init__(self, service: InferenceService | None) -> None:
        self._service = service

    @property
    def service(self) -> InferenceService:
        global _shared_service
        if self._service is None:
            # One embedded engine per process, so that every client's requests batch together.
            if _shared_service is None:
                _shared_service = make_embedded_service()
            self._service = _shared_service
        return self._service

    def _started(self) -> InferenceService:
        service = self.service
        if not service.started:
            service.start()
            _started_services[id(service)] = service
        return service

    def _request(self, body: dict[str, Any]) -> Any:
        from .request import parse_generate_body

        return parse_generate_body(body, max_new_tokens=self.service.limits.max_new_tokens)

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        service = self._started()
        stream = await service.submit(self._request(body))
        try:
            return (await stream.result()).to_json()
        except asyncio.CancelledError:
            stream.cancel()
            raise

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[tuple[str, str]]:
        service = self._started()
        stream = await service.submit(self._request(body))
        try:
            async for event in stream:
                if event.text:
                    yield event.request_id, event.text
        finally:
            if not stream.done:  # the consumer left early: free the slot now
                stream.cancel()

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        service = self._started()
        try:
            await service.wait_ready(timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"The embedded engine is still loading after {timeout:.0f} s.") from None
        return service.status()

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        service = self._started()
        if path == "infer/status":
            return service.status()
        if path == "infer/metrics":
            return service.metrics()
        if path == "infer/batches":
            limit = int((params or {}).get("limit", 50))
            return service.batches(limit)
        raise InvalidRequest(f"embedded mode has no route {path!r}")

    async def close(self) -> None:
        # A service given to this client is stopped with it; the shared one serves others.
        service = self._service
        if service is not None and service is not _shared_service and id(service) in _started_services:
            del _started_services[id(service)]
            await service.stop()


# -- streams ----------------------------------------------------------------------------------
class _StreamState:
    """What a stream learned so far: request id, text, client-side times (epoch seconds)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.id: str | None = None
        self.text = ""
        self.fragments = 0
        self.sent_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def ttft_ms(self) -> float | None:
        if self.sent_at is None or self.first_token_at is None:
            return None
        return (self.first_token_at - self.sent_at) * 1000

    @property
    def total_ms(self) -> float | None:
        if self.sent_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.sent_at) * 1000

    def _claim(self) -> None:
        if self.sent_at is not None:
            raise RuntimeError("A token stream can be read once; call client.stream(...) again for a new request.")
        self.sent_at = time.time()

    async def _produce(self, source: AsyncIterator[tuple[str, str]]) -> AsyncIterator[str]:
        try:
            async for request_id, fragment in source:
                if self.first_token_at is None:
                    self.first_token_at = time.time()
                self.id = self.id or request_id
                self.text += fragment
                self.fragments += 1
                yield fragment
        except InferError as err:
            self.error = err.message
            raise
        finally:
            self.finished_at = time.time()


class AsyncTokenStream(_StreamState):
    """``async for fragment in client.astream(prompt)``; ``.id``, ``.text`` and times after."""

    def __init__(self, io: _IOThread, prompt: str, source: Callable[[], AsyncIterator[tuple[str, str]]]) -> None:
        super().__init__(prompt)
        self._io = io
        self._source = source
        self._gen: Any = None

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> str:
        if self._gen is None:
            self._claim()
            self._gen = self._produce(self._source())
        gen = self._gen

        async def step() -> str:
            return await gen.__anext__()

        return await self._io.call(step())

    async def aclose(self) -> None:
        """Stop early: the server cancels the request and frees its slot."""
        if self._gen is not None:
            await self._io.call(self._gen.aclose())


class TokenStream(_StreamState):
    """``for fragment in client.stream(prompt)``; ``.id``, ``.text`` and times after."""

    def __init__(self, io: _IOThread, prompt: str, source: Callable[[], AsyncIterator[tuple[str, str]]]) -> None:
        super().__init__(prompt)
        self._io = io
        self._source = source

    def __iter__(self) -> Iterator[str]:
        self._claim()
        return self._iterate()

    def _iterate(self) -> Iterator[str]:
        gen = self._produce(self._source())

        async def step() -> str:
            return await gen.__anext__()

        try:
            while True:
                try:
                    yield self._io.run(step())
                except StopAsyncIteration:
                    return
        finally:
            if not self.done:  # left early (break, or Ctrl-C): cancel the request
                try:
                    self._io.run(gen.aclose())
                except RuntimeError:
                    pass  # still running: the cancelled step closes it


# -- the client -------------------------------------------------------------------------------
class Client:
    """Talk to the inference engine from a notebook or a script, sync or async.

    ``Client()`` finds the engine itself (see the module docstring); ``Client(url, token)``
    names a server; ``Client(embedded=True)`` (or an ``InferenceService``) runs the engine in
    this process; ``embedded=False`` never does.

    Sync: ``generate``, ``stream``, ``burst``, ``status``, ``metrics``, ``batches``.
    Async: ``agenerate``, ``astream``, ``aburst``, ``astatus``, ``ametrics``, ``abatches``;
    ``run(coro)`` runs a coroutine that uses them on the client's own I/O loop.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        embedded: bool | InferenceService | None = None,
        timeout: float = 300.0,
        quiet: bool = False,
    ) -> None:
        self._io = _IOThread.get()
        if embedded is not None and embedded is not False:
            service = None if embedded is True else embedded
            self.connection = Connection("embedded", "embedded")
            self._backend: _ServerBackend | _EmbeddedBackend = _EmbeddedBackend(service)
        else:
            self.connection = discover(url, token)
            if self.connection.backend == "embedded":
                if embedded is False:
                    raise EngineUnavailable(self.connection.note or "No inference server found.")
                if not quiet:
                    print(self.connection.note, file=sys.stderr)
                self._backend = _EmbeddedBackend(None)
            else:
                self._backend = _ServerBackend(self.connection.url, self.connection.token, timeout)

    # -- where ---------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """``"server"`` or ``"embedded"``."""
        return self.connection.backend

    @property
    def url(self) -> str | None:
        return self.connection.url

    @property
    def token(self) -> str | None:
        return self.connection.token

    @property
    def service(self) -> InferenceService | None:
        """The embedded engine (embedded mode only)."""
        return self._backend.service if isinstance(self._backend, _EmbeddedBackend) else None

    def __repr__(self) -> str:
        return f"<jupyter_infer.Client: {self.connection}>"

    # -- requests --------------------------------------------------------------------------------
    @staticmethod
    def _body(prompt: str, params: dict[str, Any]) -> dict[str, Any]:
        body = {"prompt": prompt}
        body.update({k: v for k, v in params.items() if v is not None})
        return body

    async def _generate(self, prompt: str, params: dict[str, Any]) -> Completion:
        sent = time.time()
        data = await self._backend.generate(self._body(prompt, params))
        return Completion.from_json(data, prompt=prompt, sent_at=sent, received_at=time.time())

    def generate(self, prompt: str, **params: Any) -> Completion:
        """Complete ``prompt`` (params: max_tokens, temperature, top_p, top_k, seed, stop, priority)."""
        return self._io.run(self._generate(prompt, params))

    async def agenerate(self, prompt: str, **params: Any) -> Completion:
        """``generate``, awaitable from any event loop."""
        return await self._io.call(self._generate(prompt, params))

    def stream(self, prompt: str, **params: Any) -> TokenStream:
        """Iterate over text fragments as the engine produces them."""
        body = self._body(prompt, params)
        return TokenStream(self._io, prompt, lambda: self._backend.stream(body))

    def astream(self, prompt: str, **params: Any) -> AsyncTokenStream:
        """``async for fragment in client.astream(prompt)``."""
        body = self._body(prompt, params)
        return AsyncTokenStream(self._io, prompt, lambda: self._backend.stream(body))

    async def _burst(
        self, prompts: list[str], rate: float | None, seed: int, params: dict[str, Any],
        on_result: Callable[[int, Completion], Any] | None = None,
    ) -> list[Completion]:
        delays = arrival_times(len(prompts), rate, seed)

        async def one(i: int, prompt: str) -> Completion:
            await asyncio.sleep(delays[i])
            sent = time.time()
            try:
                result = await self._generate(prompt, params)
            except InferError as err:
                result = Completion(None, "", "error", prompt=prompt, sent_at=sent,
                                    received_at=time.time(), error=err.message)
            if on_result is not None:
                on_result(i, result)
            return result

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    def burst(self, prompts: Iterable[str], rate: float | None = None, *, seed: int = 0, **params: Any) -> list[Completion]:
        """Send all ``prompts`` at once (or with Poisson arrivals at ``rate`` per second).

        Returns the completions in prompt order; a failed request comes back with
        ``finish_reason == "error"`` and its message in ``error`` instead of raising.
        """
        return self._io.run(self._burst(list(prompts), rate, seed, params))

    async def aburst(self, prompts: Iterable[str], rate: float | None = None, *, seed: int = 0,
                     **params: Any) -> list[Completion]:
        """``burst``, awaitable from any event loop."""
        return await self._io.call(self._burst(list(prompts), rate, seed, params))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this client's I/O loop and block until it ends; return its result.

        For load generators and benchmarks: the client's async API (``astream``,
        ``agenerate``) awaited inside ``coro`` then runs on the loop that does the I/O, with
        no hop between threads per fragment, and many requests run concurrently as asyncio
        tasks. ``coro`` must not call the sync API (it would wait on its own loop); Ctrl-C
        cancels it.
        """
        return self._io.run(coro)

    # -- views -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``GET infer/status``: engine, model, device, dtype, mode, limits, fallback reason."""
        return self._io.run(self._backend.get("infer/status"))

    async def astatus(self) -> dict[str, Any]:
        return await self._io.call(self._backend.get("infer/status"))

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Block until the engine has loaded (``status()["state"] == "ready"``); return the status."""
        return self._io.run(self._backend.wait_ready(timeout))

    async def await_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """``wait_ready``, awaitable from any event loop."""
        return await self._io.call(self._backend.wait_ready(timeout))

    def metrics(self) -> dict[str, Any]:
        """``GET infer/metrics``: counts, TTFT/latency percentiles, tokens/s, batch sizes."""
        return self._io.run(self._backend.get("infer/metrics"))

    async def ametrics(self) -> dict[str, Any]:
        return await self._io.call(self._backend.get("infer/metrics"))

    def batches(self, limit: int = 50) -> dict[str, Any]:
        """``GET infer/batches``: ``{"batches": [...], "requests": [...]}`` (recent records)."""
        return _batches_payload(self._io.run(self._backend.get("infer/batches", {"limit": limit})))

    async def abatches(self, limit: int = 50) -> dict[str, Any]:
        return _batches_payload(await self._io.call(self._backend.get("infer/batches", {"limit": limit})))

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close this client's connections; stop an embedded engine given to it (not the shared one)."""
        self._io.run(self._backend.close())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._io.call(self._backend.close())


def _batches_payload(data: Any) -> dict[str, Any]:
    """Normalize ``infer/batches`` answers: a bare list is batches only."""
    if isinstance(data, list):
        return {"batches": data, "requests": []}
    out = dict(data)
    out.setdefault("batches", [])
    out.setdefault("requests", [])
    return out


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Send offsets in seconds: all zero, or Poisson arrivals (exponential gaps) at ``rate``/s."""
    if not rate or rate <= 0:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


_default: Client | None = None


def default_client() -> Client:
    """The process's shared client (what the magics and the panel use unless given one)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


def set_default_client(client: Client | None) -> None:
    global _default
    _default = client
