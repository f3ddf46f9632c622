"""The native routes under ``<base_url>infer/`` (generate, stream, status, metrics, batches,
events, health, cancel) and the route table; the OpenAI-compatible ones are in
``openai_handlers``, what every handler shares (auth, errors, bodies) in ``handler_base``."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import Forbidden, InvalidRequest, NotFound
from ..values.events import coalesce_tokens
from ..values.request import show
from ..wire.native import native_answer, parse_generate
from . import ollama_handlers, responses_handlers
from .anthropic_handlers import CountTokensHandler, MessagesHandler
from .embedding_handlers import EmbeddingsHandler, RerankHandler
from .handler_base import AUTH_RESOURCE, GENERATE, InferHandler, NotFoundHandler, answers_errors
from .infill_handlers import InfillHandler
from .model_handlers import ModelsHandler as LocalModelsHandler
from .openai_handlers import (
    ChatCompletionsHandler,
    CompletionsHandler,
    DetokenizeHandler,
    ModelHandler,
    ModelsHandler,
    OpenAINotFoundHandler,
    TokenizeHandler,
)
from .sse import KEEPALIVE, format_event


class GenerateHandler(InferHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        request = parse_generate(self.read_json(), max_new_tokens=self.max_new_tokens)
        stream = await self.submit(request)
        result = await self.whole_result(stream)
        if result is not None:
            self.finish(native_answer(result, request, stream))


class GenerateStreamHandler(InferHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self._generate(self.read_json)

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def get(self) -> None:
        self.check_xsrf_for_get()
        # An EventSource reconnects after the stream ends, naming the last event's id (the
        # request's). 204 is what the WHATWG spec says stops it; without it every
        # reconnect would start a new generation.
        last = self.request.headers.get("Last-Event-ID")
        if last and self.service.knows(last) and self.viewer.owns(self.service.owner_of(last)):
            self.set_status(204)
            self.finish()
            return
        await self._generate(self.query_body)

    def check_xsrf_for_get(self) -> None:
        """A GET that runs the model needs the token or an XSRF proof, as POSTs do: the login
        cookie alone is what a link, an ``<img>`` or an ``EventSource`` on another site sends.
        (jupyter_server's own GET fallback, a same-host ``Referer``, is not enough here.)"""
        if self.token_authenticated or self.settings.get("disable_check_xsrf", False):
            return
        try:
            web.RequestHandler.check_xsrf_cookie(self)  # the _xsrf argument (or header) = the _xsrf cookie
        except web.HTTPError:
            raise Forbidden(
                "Starting a generation with GET needs the Jupyter token (an Authorization header or "
                "?token=) or the _xsrf cookie's value as the _xsrf query argument; the login cookie "
                "alone is refused, since a link from another site would send it too. Scripts: send "
                "the token, or POST."
            ) from None

    async def _generate(self, read: Callable[[], Any]) -> None:
        request = parse_generate(read(), max_new_tokens=self.max_new_tokens)
        await self.stream_tokens(await self.submit(request), request)


class _NotReadyYet(logging.LoggerAdapter):
    """jupyter_server logs every 5xx as an error, with the request's headers; a 503 from the
    health route is the answer a probe polls for while a model loads (minutes for a 7B one), so
    it is logged at debug level instead."""

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)


class HealthHandler(InferHandler):
    """``GET infer/health``: 200 ``{"status": "ok"}`` when the engine is ready, 503 while it
    loads or after it failed. Auth as everywhere, unless ``InferApp.health_without_auth``."""

    _track_activity = False  # a probe is not user activity (it must not defeat idle culling)

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        """The request log's logger (jupyter_server's ``log_request`` asks the handler)."""
        log = super().log
        return _NotReadyYet(log, {}) if self.get_status() == 503 else log

    @allow_unauthenticated
    async def get(self) -> None:
        if self.infer_config.health_without_auth:
            self._answer()
        else:
            await self._get_authenticated()

    @web.authenticated
    @authorized
    async def _get_authenticated(self) -> None:
        self._answer()

    def _answer(self) -> None:
        state = self.service.state
        if state not in ("ready", "unloaded"):  # unloaded serves: the next request loads the model
            self.set_status(503)
        self.finish({"status": "ok" if state == "ready" else state})


class StatusHandler(InferHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        status = self.service.status()
        # Clients time out a silent stream after a few keepalive intervals: tell them this one.
        status["limits"]["sse_keepalive_s"] = self.keepalive_s
        self.finish(status)


class MetricsHandler(InferHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        self.finish(self.viewer.metrics(self.service.metrics()))


class BatchesHandler(InferHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        batches = self.service.batches(self._limit("limit", 50), self._limit("requests", None))
        self.finish(self.viewer.batches(batches, self.service.owner_of))

    def _limit(self, name: str, default: int | None) -> int | None:
        value = self.get_query_argument(name, None)
        if value is None:
            return default
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 10_000:
            raise InvalidRequest(f"'{name}' must be an integer from 1 to 10000; got {show(value)}.", param=name)
        return int(value)


def event_frame(event: dict[str, Any]) -> str:
    """One live event as SSE."""
    return format_event(json.dumps(event), event["type"])


def event_frames(events: list[dict[str, Any]]) -> str:
    """What a subscriber is sent at a wake-up (the bus renders it once for all subscribers):
    the new events, each request's tokens as one ``token`` event."""
    return "".join(event_frame(event) for event in coalesce_tokens(events))


class EventsHandler(InferHandler):
    """Live scheduler events (queued, admitted, token, finished, batch, step) as SSE.

    Each wake-up writes everything new in one write, a request's tokens since the last write
    as one ``token`` event (its text joined, ``index`` the last); a subscriber that fell too
    far behind first gets ``event: dropped`` with the count it lost.
    """

    _track_activity = False  # a panel left open is not user activity
    _subscription: Any = None

    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        bus = self.service.events
        viewer = self.viewer
        render = event_frames if viewer.sees_all else viewer.render  # others' requests anonymous
        self._subscription = subscription = self.service.subscribe()
        try:
            self.start_event_stream()
            if not await self.send(""):
                return
            writing: Awaitable[None] | None = None  # the last write, still on its way to the client
            while not subscription.closed:
                ready = await subscription.wait(self.keepalive_s)
                if writing is not None:  # one write in flight at most: a client that does not
                    await writing  # read holds only this one, and the log drops for it meanwhile
                if subscription.closed:
                    break
                if not ready:
                    text, entries = KEEPALIVE, []
                else:
                    entries, lost = subscription.take()
                    text = bus.render(entries, render)
                    if lost:
                        text = event_frame({"type": "dropped", "count": lost}) + text
                self.write(text)
                # Not awaited here: a wake-up per subscriber per write saved.
                writing = self.flush()
                if any(e.event["type"] == "shutdown" for e in entries):
                    await writing
                    break
        except StreamClosedError:
            pass  # the client left
        finally:
            subscription.close()
        self.finish_event_stream()

    def on_connection_close(self) -> None:
        if self._subscription is not None:
            self._subscription.close()  # wakes the writer, which ends
        super().on_connection_close()


class RequestHandler(InferHandler):
    """``DELETE infer/requests/{id}``: cancel one queued or running request."""

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def delete(self, request_id: str) -> None:
        # Another user's request is answered as one that does not exist: no way to tell.
        owner = self.service.owner_of(request_id)
        if owner is not None and not self.viewer.owns(owner) or not self.service.cancel(request_id):
            raise NotFound(f"No queued or running request has the id {show(request_id)}; it may have finished.")
        self.finish({"id": request_id, "cancelled": True})


class LandingHandler(JupyterHandler):
    """``GET infer/``: a page, not an API route, so that a browser without a session is sent to
    log in (to the hub's OAuth on JupyterHub, to the login page otherwise) instead of getting
    a 403; once logged in it lands on ``infer/status``."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.redirect(url_path_join(self.base_url, "infer/status"))


def routes() -> list[tuple[str, type]]:
    """The extension's routes; ``ExtensionApp`` puts the server's ``base_url`` in front."""
    return [
        (r"/infer/generate", GenerateHandler),
        (r"/infer/generate_stream", GenerateStreamHandler),
        (r"/infer/status", StatusHandler),
        (r"/infer/metrics", MetricsHandler),
        (r"/infer/batches", BatchesHandler),
        (r"/infer/events", EventsHandler),
        (r"/infer/v1/completions", CompletionsHandler),
        (r"/infer/v1/chat/completions", ChatCompletionsHandler),
        (r"/infer/v1/models", ModelsHandler),
        (r"/infer/v1/models/(.+)", ModelHandler),
        (r"/infer/v1/messages", MessagesHandler),  # Anthropic's Messages API
        (r"/infer/v1/messages/count_tokens", CountTokensHandler),
        (r"/infer/v1/embeddings", EmbeddingsHandler),
        (r"/infer/v1/rerank", RerankHandler),  # llama-server's, vLLM's and Jina's shape
        *responses_handlers.ROUTES,  # OpenAI's Responses API
        (r"/infer/v1/.*", OpenAINotFoundHandler),
        (r"/infer/health", HealthHandler),
        (r"/infer/tokenize", TokenizeHandler),
        (r"/infer/infill", InfillHandler),  # llama-server's code infill
        (r"/infer/rerank", RerankHandler),
        (r"/infer/detokenize", DetokenizeHandler),
        (r"/infer/requests/([^/]+)", RequestHandler),
        (r"/infer/models", LocalModelsHandler),
        *ollama_handlers.ROUTES,  # Ollama's API under infer/api/
        (r"/infer/?", LandingHandler),
        (r"/infer/.*", NotFoundHandler),
    ]
