"""``Client``: generate, stream, burst, cancel, and the server's views, sync and async."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from ...constraints.spec import closed_schema
from ...errors import EngineUnavailable, InferError
from .arrivals import arrival_times
from .backend import Backend
from .discovery import ENV_TOKEN, ENV_URL, Connection, discover
from .embedded import EmbeddedBackend
from .function_tools import as_tool
from .io_thread import IOThread
from .openai_backend import is_openai_url
from .results import Completion
from .streams import AsyncTokenStream, TokenStream

if TYPE_CHECKING:
    from ...service.inference import InferenceService

T = TypeVar("T")


class Client:
    """Talk to the inference engine from a notebook or a script, sync or async.

    ``Client()`` finds the engine itself (see ``jupyter_infer.kernel.client.discovery``);
    ``Client(url, token)`` names a server; ``Client(embedded=True)`` (or an
    ``InferenceService``) runs the engine in this process; ``embedded=False`` never does.
    ``Client(url="http://vllm:8000/v1", api_key=...)`` talks to a plain OpenAI-compatible
    server directly (an ``api_key``, or a URL ending in ``/v1``, says so; ``model`` picks its
    model): the same API, with client-side timings (``jupyter_infer.kernel.client.openai_backend``).
    ``JUPYTER_INFER_URL`` may name such a URL too (``JUPYTER_INFER_TOKEN`` is then its key),
    so the magics and the panel use it.

    ``timeout`` bounds a whole ``generate`` (seconds); ``read_timeout`` is the longest a
    stream may stay silent before the server counts as gone (default: three of the server's
    keepalive intervals, 45 s). Either ends the call with ``ServerTimeout``.

    Sync: ``generate``, ``stream``, ``burst``, ``cancel``, ``status``, ``metrics``, ``batches``.
    Async: ``agenerate``, ``astream``, ``aburst``, ``acancel``, ``astatus``, ``ametrics``,
    ``abatches``. ``run(coro)`` runs a coroutine that uses them on the client's own I/O loop
    and waits; ``submit(coro)`` starts it there and returns a future at once.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        embedded: bool | InferenceService | None = None,
        timeout: float = 300.0,
        read_timeout: float | None = None,
        quiet: bool = False,
        api_key: str | None = None,
        model: str | None = None,
    ) -> None:
        self._io = IOThread.get()
        self._backend: Backend
        env_url = os.environ.get(ENV_URL)
        if url is None and embedded in (None, False) and is_openai_url(env_url):
            url, token = env_url, token or os.environ.get(ENV_TOKEN)  # the magics' way to a plain server
        if url and (api_key is not None or is_openai_url(url)):
            from .openai_backend import OpenAIBackend

            self._backend = OpenAIBackend(url, api_key if api_key is not None else token, model=model,
                                          timeout=read_timeout or timeout)
            self.connection = Connection("openai", "explicit", self._backend.url)
            return
        if embedded is not None and embedded is not False:
            service = None if embedded is True else embedded
            self.connection = Connection("embedded", "embedded")
            self._backend = EmbeddedBackend(service)
            return
        self.connection = discover(url, token)
        if self.connection.backend == "server":
            from .http import HTTPBackend

            self._backend = HTTPBackend(self.connection.url, self.connection.token, timeout, read_timeout)
            return
        if embedded is False:
            raise EngineUnavailable(self.connection.note or "No inference server found.")
        if not quiet:
            print(self.connection.note, file=sys.stderr)
        self._backend = EmbeddedBackend(None)

    # -- where ---------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """``"server"``, ``"embedded"`` or ``"openai"`` (a plain OpenAI-compatible server)."""
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
        return self._backend.service if isinstance(self._backend, EmbeddedBackend) else None

    def __repr__(self) -> str:
        return f"<jupyter_infer.Client: {self.connection}>"

    # -- running coroutines on the client's loop ---------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this client's I/O loop and block until it ends; return its result.

        For load generators and benchmarks: the client's async API (``astream``,
        ``agenerate``) awaited inside ``coro`` then runs on the loop that does the I/O, with
        no hop between threads per fragment, and many requests run concurrently as asyncio
        tasks. ``coro`` must not call the sync API (it would wait on its own loop); Ctrl-C
        cancels it.
        """
        return self._io.run(coro)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on this client's I/O loop and return at once.

        The ``concurrent.futures.Future`` gives its result (``future.result()``, or
        ``await asyncio.wrap_future(future)``); ``future.cancel()`` cancels it. For work that
        runs while the caller's thread does something else, e.g. redraws a widget.
        """
        return self._io.submit(coro)

    # -- requests --------------------------------------------------------------------------------
    @staticmethod
    def _body(prompt: str, params: dict[str, Any]) -> dict[str, Any]:
        params, _ = _schema(params)
        body = {"prompt": prompt}
        body.update({k: v for k, v in params.items() if v is not None})
        return body

    async def _generate(self, prompt: str, params: dict[str, Any]) -> Completion:
        sent = time.time()
        params, read = _schema(params)
        data = await self._backend.generate(self._body(prompt, params))
        completion = Completion.from_json(data, prompt=prompt, sent_at=sent, received_at=time.time())
        if read is not None and completion.finish_reason == "stop":
            completion.parsed = read(completion.text)
        return completion

    async def _chat(self, messages: list[dict[str, Any]], tools: list[Any] | None, params: dict[str, Any]) -> Completion:
        sent = time.time()
        body = {k: v for k, v in params.items() if v is not None}
        body["messages"] = messages
        if tools:
            body["tools"] = [as_tool(t) for t in tools]
        data = await self._backend.generate(body)
        completion = Completion.from_json(data, prompt=None, sent_at=sent, received_at=time.time())
        if data.get("tool_calls"):  # the server read them (a call cut short stays text)
            completion.tool_calls, completion.text = data["tool_calls"], ""
        return completion

    def chat(self, messages: list[dict[str, Any]], *, tools: list[Any] | None = None, **params: Any) -> Completion:
        """Answer a chat (OpenAI's message list, tool calls and results included). ``tools``:
        Python functions (their schema from the signature and docstring) or OpenAI tool
        dicts; ``tool_choice`` ("auto", "required", "none" or a tool's name as
        ``{"type": "function", "function": {"name": ...}}``) and ``parallel_tool_calls`` as
        OpenAI's. The answer's calls are in ``.tool_calls``."""
        return self._io.run(self._chat(messages, tools, params))

    async def achat(self, messages: list[dict[str, Any]], *, tools: list[Any] | None = None,
                    **params: Any) -> Completion:
        """``chat``, awaitable from any event loop."""
        return await self._io.call(self._chat(messages, tools, params))

    def generate(self, prompt: str, **params: Any) -> Completion:
        """Complete ``prompt`` (params: max_tokens, temperature, top_p, top_k, seed, stop, priority).

        Structured answers: ``schema=`` a pydantic model (or a JSON schema dict) makes the answer
        fit it, and ``.parsed`` the model's instance (or the JSON value); ``json_schema=``,
        ``regex=``, ``choice=`` (a list of strings) and ``grammar=`` (Lark or GBNF) constrain the
        text the same way."""
        return self._io.run(self._generate(prompt, params))

    async def agenerate(self, prompt: str, **params: Any) -> Completion:
        """``generate``, awaitable from any event loop."""
        return await self._io.call(self._generate(prompt, params))

    def stream(self, prompt: str, **params: Any) -> TokenStream:
        """Iterate over text fragments as the engine produces them; ``.completion`` after."""
        body = self._body(prompt, params)
        backend = self._backend
        return TokenStream(self._io, prompt, lambda: backend.stream(body))

    def stream_chat(self, messages: list[dict[str, Any]], **params: Any) -> TokenStream:
        """``stream`` for a chat: the messages go through the model's chat template."""
        body = {**{k: v for k, v in params.items() if v is not None}, "messages": messages}
        backend = self._backend
        return TokenStream(self._io, messages[-1].get("content", ""), lambda: backend.stream(body))

    def astream(self, prompt: str, **params: Any) -> AsyncTokenStream:
        """``async for fragment in client.astream(prompt)``; ``.completion`` after."""
        body = self._body(prompt, params)
        backend = self._backend
        return AsyncTokenStream(self._io, prompt, lambda: backend.stream(body))

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

    def burst(self, prompts: Iterable[str], rate: float | None = None, *, seed: int = 0,
              on_result: Callable[[int, Completion], Any] | None = None, **params: Any) -> list[Completion]:
        """Send all ``prompts`` at once (or with Poisson arrivals at ``rate`` per second).

        Returns the completions in prompt order; a failed request comes back with
        ``finish_reason == "error"`` and its message in ``error`` instead of raising.
        ``on_result(index, completion)`` is called (on the client's I/O thread) as each ends.
        """
        return self._io.run(self._burst(list(prompts), rate, seed, params, on_result))

    async def aburst(self, prompts: Iterable[str], rate: float | None = None, *, seed: int = 0,
                     on_result: Callable[[int, Completion], Any] | None = None,
                     **params: Any) -> list[Completion]:
        """``burst``, awaitable from any event loop."""
        return await self._io.call(self._burst(list(prompts), rate, seed, params, on_result))

    def cancel(self, request_id: str) -> bool:
        """Cancel one queued or running request (by its id, e.g. ``stream.id``), whoever sent it.

        True if it was in flight; False if it had already ended or never existed. Its stream
        then ends with ``finish_reason == "cancelled"``.
        """
        return self._io.run(self._backend.cancel(request_id))

    async def acancel(self, request_id: str) -> bool:
        """``cancel``, awaitable from any event loop."""
        return await self._io.call(self._backend.cancel(request_id))

    # -- views -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``GET infer/status``: engine, model, device, dtype, mode, limits, fallback reason."""
        return self._io.run(self._backend.status())

    async def astatus(self) -> dict[str, Any]:
        return await self._io.call(self._backend.status())

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Block until the engine has loaded (``status()["state"] == "ready"``); return the status."""
        return self._io.run(self._backend.wait_ready(timeout))

    async def await_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """``wait_ready``, awaitable from any event loop."""
        return await self._io.call(self._backend.wait_ready(timeout))

    def metrics(self) -> dict[str, Any]:
        """``GET infer/metrics``: counts, TTFT/latency percentiles, tokens/s, batch sizes."""
        return self._io.run(self._backend.metrics())

    async def ametrics(self) -> dict[str, Any]:
        return await self._io.call(self._backend.metrics())

    def models(self) -> dict[str, Any]:
        """``GET infer/models``: the models this machine can serve, which one is loaded."""
        return self._io.run(self._backend.models())

    def load_model(self, model: str, **options: Any) -> dict[str, Any]:
        """Serve ``model`` (a listed id, a folder, a .gguf file, a Hub id) in place of the
        loaded one; ``options``: quantize, dtype, device, num_threads. Returns once it is ready
        (``EngineUnavailable`` saying why it could not load)."""
        return self._io.run(self._backend.models("POST", {"model": model, **options}))

    def unload_model(self) -> dict[str, Any]:
        """Unload the model (its memory back); the next request loads it again."""
        return self._io.run(self._backend.models("DELETE"))

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """``GET infer/batches``: ``{"batches": [...], "requests": [...], ...}``, the last
        ``limit`` batch records and (``requests``, or the server's default) request records."""
        return self._io.run(self._backend.batches(limit, requests))

    async def abatches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        return await self._io.call(self._backend.batches(limit, requests))

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close this client's connections; stop an embedded engine given to it (not the shared one)."""
        self._io.run(self._backend.close())

    async def aclose(self) -> None:
        """``close``, awaitable from any event loop."""
        await self._io.call(self._backend.close())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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


def _schema(params: dict[str, Any]) -> tuple[dict[str, Any], Callable[[str], Any] | None]:
    """``schema=`` as the ``json_schema`` the server takes, and how to read the answer back."""
    schema = params.get("schema")
    if schema is None:
        return params, None
    rest = {k: v for k, v in params.items() if k != "schema"}
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # a pydantic model
        # Closed as the openai SDK's parse closes it: an answer holds the model's fields, not an endless tail.
        return {**rest, "json_schema": closed_schema(schema.model_json_schema())}, schema.model_validate_json
    return {**rest, "json_schema": schema}, json.loads
