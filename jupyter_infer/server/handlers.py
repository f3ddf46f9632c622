"""The HTTP routes under ``<base_url>infer/``: validate → service → shape the answer.

Every verb is ``@web.authenticated`` + ``@authorized`` on the ``jupyter_infer`` resource:
reads (status, metrics, batches, events, models) need ``read``; generating needs ``execute``.
Errors a user can hit are ``InferError``s, answered as JSON ``{"message": ...}`` (OpenAI's
``{"error": {...}}`` under ``infer/v1/``) with their status; nothing is queued on bad input.
Every other exception on a request path (the framework's ``HTTPError``s, a bug) is answered
in the same shape, without internals, and a refused generation is counted in the metrics.

Bodies are streamed (``@stream_request_body``): the auth checks run before a byte of the
body is read, a body over ``max_body_bytes`` is refused with 413 as soon as that is known,
and a body that takes longer than ``body_timeout_s`` to arrive is cut off.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from http.client import responses
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import (
    Forbidden,
    InferError,
    InternalError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    refusal_reason,
)
from ..events import coalesce_tokens
from ..metrics import wall
from ..request import Request, RequestResult, parse_generate_body, show
from ..scheduler import RequestStream
from ..service import InferenceService
from . import openai_api
from .sse import KEEPALIVE, EventStreamHandler, format_event

AUTH_RESOURCE = "jupyter_infer"
SERVICE_KEY = "jupyter_infer.service"  # settings key of the one InferenceService
GENERATE = "execute"  # the auth action that running the model needs
_QUERY_INTS = {"max_tokens", "top_k", "seed", "priority"}
_QUERY_FLOATS = {"temperature", "top_p"}
_QUERY_IGNORED = {"token", "_xsrf", "no_track_activity"}

F = TypeVar("F", bound=Callable[..., Awaitable[None]])
log = logging.getLogger(__name__)


def answers_errors(method: F) -> F:
    """Answer any exception of ``method`` as a JSON error in the route's shape (or an SSE
    error event, once the event stream has started)."""

    @functools.wraps(method)
    async def wrapper(self: InferHandler, *args: Any, **kwargs: Any) -> None:
        if self._finished:
            return  # refused while its body was arriving
        try:
            await method(self, *args, **kwargs)
        except StreamClosedError:
            pass  # the client left: nobody to answer
        except Exception as err:
            self.answer_error(as_infer_error(err))

    return wrapper  # type: ignore[return-value]


_HTTP_MESSAGES = {
    403: "Forbidden: this needs Jupyter's auth, the token (an 'Authorization: token <t>' header, or "
         "?token=) or the browser's login cookie with its XSRF header.",
    405: "This route does not answer this HTTP method (see docs/server.md for its verbs).",
}


class HTTPFailure(InferError):
    """A framework ``HTTPError`` (403 from auth, 405, a query that is not UTF-8, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = {403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            status, "invalid_request" if status < 500 else "internal_error")


def as_infer_error(err: BaseException, *, log_unexpected: bool = True) -> InferError:
    """What to answer for ``err``: an ``InferError`` as it is, anything else without internals."""
    if isinstance(err, InferError):
        return err
    if isinstance(err, RecursionError):
        return InvalidRequest("The request is nested too deeply to read; send a flat JSON object.")
    if isinstance(err, web.HTTPError):
        message = err.log_message % err.args if err.log_message and err.args else err.log_message
        return HTTPFailure(err.status_code, message or _HTTP_MESSAGES.get(
            err.status_code, err.reason or responses.get(err.status_code, "error")))
    if log_unexpected:
        log.error("jupyter_infer: unexpected error on a request", exc_info=err)
    return InternalError("The server failed on this request (an internal error, written to the server's "
                         "log). Try again, and report it if it persists.")


@web.stream_request_body
class InferHandler(EventStreamHandler):
    auth_resource = AUTH_RESOURCE
    # Routes that run the model: their refusals and failures are counted in infer/metrics.
    generates = False

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.keepalive_s = self.infer_config.sse_keepalive_s
        self._body = bytearray()
        self._handed_over = False  # the service has the request: it counts what happens now

    async def prepare(self) -> None:  # type: ignore[override]
        """Auth first (jupyter_server's checks raise 403/404 here, before any body is read),
        then the body's bounds: its declared size, and how long it may take to arrive."""
        await super().prepare()
        if self._finished:
            return
        limit = self.infer_config.max_body_bytes
        declared = self.request.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            self.answer_error(self.too_large(int(declared), limit))
            return
        set_body_timeout = getattr(self.request.connection, "set_body_timeout", None)
        if set_body_timeout is not None:
            set_body_timeout(self.infer_config.body_timeout_s)

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._body += chunk
        limit = self.infer_config.max_body_bytes
        if len(self._body) > limit:  # a chunked body, with no Content-Length to check first
            self._body = bytearray()
            self.answer_error(self.too_large(None, limit))

    @staticmethod
    def too_large(size: int | None, limit: int) -> PayloadTooLarge:
        what = f"is {size} bytes" if size is not None else "is larger than that"
        return PayloadTooLarge(
            f"The request body {what}, above this server's limit of {limit} bytes "
            "(InferApp.max_body_bytes). Send a shorter prompt."
        )

    @property
    def service(self) -> InferenceService:
        return self.settings[SERVICE_KEY]

    @property
    def infer_config(self) -> Any:
        """The ``InferApp`` trait values (jupyter_server puts them in ``<name>_config``)."""
        return self.settings[f"{AUTH_RESOURCE}_config"]

    @property
    def max_new_tokens(self) -> int:
        return self.service.limits.max_new_tokens

    # -- input ------------------------------------------------------------------------------
    def read_json(self) -> Any:
        body, self._body = bytes(self._body), bytearray()
        if not body.strip():
            raise InvalidRequest("The request body is empty: send a JSON object such as {\"prompt\": \"...\"}.")
        try:
            return json.loads(body)
        except RecursionError:
            raise InvalidRequest("The request body is nested too deeply to read; send a flat JSON object.") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise InvalidRequest(f"The request body is not valid JSON ({show(str(err))}).") from None

    def query_body(self) -> dict[str, Any]:
        """``GET`` query parameters as a generate body (for ``EventSource``, which cannot POST)."""
        body: dict[str, Any] = {}
        for name in self.request.query_arguments:
            if name in _QUERY_IGNORED:
                continue
            values = self.get_query_arguments(name, strip=False)
            if name == "stop":
                body[name] = values
                continue
            value = values[-1]
            try:
                if name in _QUERY_INTS:
                    body[name] = int(value)
                elif name in _QUERY_FLOATS:
                    body[name] = float(value)
                else:
                    body[name] = value
            except ValueError:
                raise InvalidRequest(f"'{name}' must be a number; got {show(value)}.", param=name) from None
        return body

    async def submit(self, request: Request) -> RequestStream:
        self._handed_over = True  # from here on the service counts a refusal
        stream = await self.service.submit(request)
        self._stream = stream  # cancelled if the client leaves
        if self.gone.is_set():  # it left while we waited for the engine to load
            stream.cancel()
        self.set_header("X-Request-Id", stream.id)
        return stream

    # -- output -----------------------------------------------------------------------------
    def error_body(self, err: InferError) -> dict[str, Any]:
        return {"message": err.message, "code": err.code, "param": err.param}

    def answer_error(self, err: InferError) -> None:
        """Answer ``err``; on a generating route, count a request refused or failed before the
        service had it (the service counts its own)."""
        if self.generates and not self._handed_over:
            self._handed_over = True  # count once
            self.service.reject(refusal_reason(err.status), outcome="failed" if err.status >= 500 else "rejected")
        if not self._finished:
            self.write_infer_error(err)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Errors raised outside our methods (auth in ``prepare``, 405, ...) in our shape."""
        exc_info = kwargs.get("exc_info")
        if exc_info and exc_info[1] is not None:
            err = as_infer_error(exc_info[1], log_unexpected=False)  # tornado logged it already
        else:
            err = HTTPFailure(status_code, responses.get(status_code, "error"))
        self.answer_error(err)

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:
            body = self.error_body(err)
            if self._stream is not None:
                body["id"] = self._stream.id
            self.write(format_event(json.dumps(body), "error"))
            self.finish_event_stream()
            return
        self.set_status(err.status)
        if isinstance(err, QueueFull):
            self.set_header("Retry-After", str(max(1, math.ceil(err.retry_after))))
        self.finish(json.dumps(self.error_body(err)))

    async def stream_tokens(self, stream: RequestStream) -> None:
        """The contract's SSE: ``token`` events, then ``result`` (usage, timings, batch) and
        ``done``, or ``error``."""
        self.start_event_stream()
        if not await self.send(""):
            return
        outcome = await self.relay(stream, lambda ev: format_event(ev.text, "token", ev.request_id))
        if outcome is None:
            return  # the client left; the request is cancelled
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
            return
        await self.send(format_event(json.dumps(outcome.to_json()), "result", stream.id)
                        + format_event("[DONE]", "done", stream.id))
        self.finish_event_stream()

    async def whole_result(self, stream: RequestStream) -> RequestResult | None:
        """Wait for the whole result; ``None`` if the client left meanwhile."""
        result = await stream.result()
        return None if self.gone.is_set() else result


class GenerateHandler(InferHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        request = parse_generate_body(self.read_json(), max_new_tokens=self.max_new_tokens)
        result = await self.whole_result(await self.submit(request))
        if result is not None:
            self.finish(result.to_json())


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
        request = parse_generate_body(read(), max_new_tokens=self.max_new_tokens)
        await self.stream_tokens(await self.submit(request))


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
        self.finish(self.service.metrics())


class BatchesHandler(InferHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        self.finish(self.service.batches(self._limit("limit", 50), self._limit("requests", None)))

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
                    text = bus.render(entries, event_frames)
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


# -- OpenAI-compatible ------------------------------------------------------------------------
class OpenAIHandler(InferHandler):
    def error_body(self, err: InferError) -> dict[str, Any]:
        return openai_api.error_body(err)

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:  # OpenAI streams report a late error as a data chunk
            self.write(format_event(json.dumps(self.error_body(err))))
            self.finish_event_stream()
            return
        super().write_infer_error(err)

    async def complete(self, parse: Callable[..., openai_api.OpenAIRequest], chat: bool) -> None:
        info = await self.service.wait_ready()
        parsed = parse(self.read_json(), info, max_new_tokens=self.max_new_tokens)
        stream = await self.submit(parsed.request)
        shape = openai_api.Shaper(chat, stream.id, parsed.model, parsed.include_usage)
        if not parsed.stream:
            result = await self.whole_result(stream)
            if result is not None:
                self.finish(shape.whole(result))
            return

        def data(obj: Any) -> str:
            return format_event(json.dumps(obj))

        self.start_event_stream()
        if chat and not await self.send(data(shape.chunk("", first=True))):
            return
        outcome = await self.relay(stream, lambda ev: data(shape.chunk(ev.text)))
        if outcome is None:
            return
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
            return
        text = data(shape.last_chunk(outcome))
        if parsed.include_usage:
            text += data(shape.usage_chunk(outcome))
        await self.send(text + format_event("[DONE]"))
        self.finish_event_stream()


class CompletionsHandler(OpenAIHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self.complete(openai_api.parse_completion, chat=False)


class ChatCompletionsHandler(OpenAIHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self.complete(openai_api.parse_chat, chat=True)


class ModelsHandler(OpenAIHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        info = await self.service.wait_ready()
        created = int(wall(self.service.collector.started_at))
        self.finish(openai_api.models_list(info, created))


class RequestHandler(InferHandler):
    """``DELETE infer/requests/{id}``: cancel one queued or running request."""

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def delete(self, request_id: str) -> None:
        if not self.service.cancel(request_id):
            raise NotFound(f"No queued or running request has the id {show(request_id)}; it may have finished.")
        self.finish({"id": request_id, "cancelled": True})


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
        (r"/infer/requests/([^/]+)", RequestHandler),
    ]
