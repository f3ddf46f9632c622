"""The HTTP routes under ``<base_url>infer/``: validate → service → shape the answer.

Every verb is ``@web.authenticated`` + ``@authorized`` on the ``jupyter_infer`` resource:
reads (status, metrics, batches, events, models, health, tokenize) need ``read``; generating
needs ``execute``. ``infer/health`` may be opened to probes without auth
(``InferApp.health_without_auth``). Errors a user can hit are ``InferError``s, answered as
JSON ``{"message": ...}`` (OpenAI's ``{"error": {...}}`` under ``infer/v1/`` and on the vLLM
tokenizer routes, including the 401/404/405 that tornado and jupyter_server raise
themselves) with their status; nothing is queued on bad input. Every other exception on a
request path (a bug included) is answered in the same shape, without internals, and a
refused generation is counted in the metrics.

Bodies are streamed (``@stream_request_body``): the auth checks run before a byte of the
body is read, a body over ``max_body_bytes`` is refused with 413 as soon as that is known,
and a body that takes longer than ``body_timeout_s`` to arrive is cut off.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from http.client import responses
from typing import Any, TypeVar

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
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
from ..request import Request, RequestResult, TokenEvent, parse_generate_body, show
from ..scheduler import RequestStream
from ..service import InferenceService
from . import openai_api
from .sse import KEEPALIVE, EventStreamHandler, format_event

AUTH_RESOURCE = "jupyter_infer"
SERVICE_KEY = "jupyter_infer.service"  # settings key of the one InferenceService
GENERATE = "execute"  # the auth action that running the model needs
_QUERY_INTS = {"max_tokens", "top_k", "seed", "priority", "min_tokens"}
_QUERY_FLOATS = {"temperature", "top_p", "repetition_penalty", "frequency_penalty", "presence_penalty"}
_QUERY_FLAGS = {"ignore_eos"}
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
                if name in _QUERY_FLAGS:
                    if value.lower() not in {"true", "false", "1", "0"}:
                        raise ValueError(value)
                    body[name] = value.lower() in {"true", "1"}
                elif name in _QUERY_INTS:
                    body[name] = int(value)
                elif name in _QUERY_FLOATS:
                    body[name] = float(value)
                else:
                    body[name] = value
            except ValueError:
                raise InvalidRequest(f"'{name}' must be a number (or true/false); got {show(value)}.", param=name) from None
        return body

    async def submit(self, request: Request) -> RequestStream:
        return (await self.submit_all([request]))[0]

    async def submit_all(self, requests: list[Request]) -> list[RequestStream]:
        """Queue every request, or none: if one is refused, those already queued are
        cancelled and the refusal is raised."""
        self._handed_over = True  # from here on the service counts a refusal
        try:
            for request in requests:
                stream = await self.service.submit(request)
                self.request_streams.append(stream)  # cancelled if the client leaves
        except InferError:
            for stream in self.request_streams:
                stream.cancel()
            raise
        if self.gone.is_set():  # it left while we waited for the engine to load
            for stream in self.request_streams:
                stream.cancel()
        first = self.request_streams[0]
        self.set_header("X-Request-Id", first.id)
        if first.route is not None:  # engine = "router": the backend that serves it
            self.set_header("X-Route", first.route)
        return list(self.request_streams)

    # -- output -----------------------------------------------------------------------------
    def error_body(self, err: InferError) -> dict[str, Any]:
        return {"message": err.message, "code": err.code, "param": err.param}

    def count_refusal(self, status: int) -> None:
        """On a generating route, count a request refused or failed before the service had
        it (the service counts its own), once."""
        if self.generates and not self._handed_over:
            self._handed_over = True
            self.service.reject(refusal_reason(status), outcome="failed" if status >= 500 else "rejected")

    def answer_error(self, err: InferError) -> None:
        self.count_refusal(err.status)
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
            if self.request_streams:
                body["id"] = self.request_streams[0].id
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

        def render(_: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent) and event.text:
                return format_event(event.text, "token", event.request_id)
            return ""

        outcome = await self.relay([stream], render)
        if outcome is None:
            return  # the client left; the request is cancelled
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
            return
        await self.send(format_event(json.dumps(outcome[0].to_json()), "result", stream.id)
                        + format_event("[DONE]", "done", stream.id))
        self.finish_event_stream()

    async def whole_result(self, stream: RequestStream) -> RequestResult | None:
        """Wait for the whole result; ``None`` if the client left meanwhile."""
        result = await stream.result()
        if result.route is not None:  # a fallback may have moved it since submit
            self.set_header("X-Route", result.route)
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
        # An EventSource reconnects after the stream ends, naming the last event's id (the
        # request's). 204 is what the WHATWG spec says stops it; without it every
        # reconnect would start a new generation.
        last = self.request.headers.get("Last-Event-ID")
        if last and self.service.knows(last):
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
        request = parse_generate_body(read(), max_new_tokens=self.max_new_tokens)
        await self.stream_tokens(await self.submit(request))


class HealthHandler(InferHandler):
    """``GET infer/health``: 200 ``{"status": "ok"}`` when the engine is ready, 503 while it
    loads or after it failed. Auth as everywhere, unless ``InferApp.health_without_auth``."""

    _track_activity = False  # a probe is not user activity (it must not defeat idle culling)

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
        if state != "ready":
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
INVALID_KEY = ("Invalid or missing API key: use this Jupyter server's token as the API key "
               "(Authorization: Bearer <token>).")


class OpenAIHandler(InferHandler):
    """Errors in the client's language: OpenAI's ``{"error": {...}}`` for what we raise and
    for what tornado and jupyter_server raise (401 for a bad key, where jupyter_server would
    say 403 or complain about a missing ``_xsrf``; 404; 405)."""

    def error_body(self, err: InferError) -> dict[str, Any]:
        return openai_api.error_body(err)

    def check_xsrf_cookie(self) -> None:
        # jupyter_server checks XSRF on a POST whose token did not authenticate it; for an
        # API client that sent a wrong key the truth is 401, not "'_xsrf' argument missing".
        if hasattr(self, "_jupyter_current_user") and self.current_user is None:
            raise web.HTTPError(401, INVALID_KEY)
        super().check_xsrf_cookie()

    def get_login_url(self) -> str:
        raise web.HTTPError(401, INVALID_KEY)  # what @web.authenticated asks for without a user

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.count_refusal(status_code)
        err = kwargs.get("exc_info", (None, None))[1]
        message = getattr(err, "log_message", None) or self._reason
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed"}.get(status_code)
        if status_code == 405:
            message = f"{self.request.method} is not allowed on {self.request.path}."
        if status_code >= 500 and not isinstance(err, web.HTTPError):
            message = "The server failed on this request; see its log."
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(openai_api.error_json(status_code, message, code)))

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:  # OpenAI streams report a late error as a data chunk, then end
            self.write(format_event(json.dumps(self.error_body(err))) + format_event("[DONE]"))
            self.finish_event_stream()
            return
        super().write_infer_error(err)

    async def complete(self, parse: Callable[..., openai_api.OpenAIRequest], chat: bool) -> None:
        info = await self.service.wait_ready()
        call = parse(self.read_json(), info, max_new_tokens=self.max_new_tokens,
                     max_choices=self.infer_config.max_choices)
        if call.ignored:  # names as sent: escaped and cut short, so that any name makes a valid header
            names = [json.dumps(show(name) if len(name) > 60 else name)[1:-1] for name in call.ignored[:20]]
            self.set_header("X-Ignored-Fields", ", ".join(names) + (", ..." if len(call.ignored) > 20 else ""))
        streams = await self.submit_all(call.requests)
        call.model = streams[0].model or call.model  # behind a router: the model that serves it
        shape = openai_api.Shaper(chat, streams[0].id, call, self.service.token_texts)
        if call.stream:
            await self._stream_choices(streams, call, shape)
            return
        try:
            results = await asyncio.gather(*(s.result() for s in streams))
        finally:
            for stream in streams:
                if not stream.done:
                    stream.cancel()  # another choice failed, or the client left
        if not self.gone.is_set():
            self.finish(shape.whole(results))

    async def _stream_choices(
        self, streams: list[RequestStream], call: openai_api.OpenAIRequest, shape: openai_api.Shaper,
    ) -> None:
        """Chunks of every choice, interleaved as they come, each with its ``index``."""
        chat = shape.chat
        tokens = [0] * len(streams)  # completion tokens so far, per choice
        chars = [0] * len(streams)  # text sent so far, per choice (logprobs' text_offset)
        records = [0] * len(streams)  # logprob records sent so far, per choice
        opened = [chat] * len(streams)  # completions: the echo chunk is sent (chat: role chunk)

        def data(obj: Any) -> str:
            return format_event(json.dumps(obj))

        def usage(i: int) -> dict[str, int] | None:
            if not call.continuous_usage:
                return None
            return shape.usage([len(streams[i].prompt_ids)], [tokens[i]])

        def echo(i: int, prompt_logprobs: Any) -> str:
            opened[i] = True
            if not call.echo:
                return ""
            text = call.requests[i].prompt
            chars[i] = len(text)
            return data(shape.chunk(i, text, logprobs=shape.echo_logprobs(streams[i].prompt_ids, prompt_logprobs),
                                    usage=usage(i)))

        def render(i: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent):
                text = "" if opened[i] else echo(i, event.prompt_logprobs)
                tokens[i] = event.index
                records[i] += len(event.logprobs)
                lp = shape.event_logprobs(event.logprobs, chars[i])
                chars[i] += len(event.text)
                if event.text or lp is not None:
                    text += data(shape.chunk(i, event.text, logprobs=lp, usage=usage(i)))
                return text
            text = "" if opened[i] else echo(i, event.prompt_logprobs)
            tokens[i] = event.completion_tokens
            rest = (event.logprobs or ())[records[i]:]
            lp = shape.event_logprobs(rest, chars[i]) if rest else None
            return text + data(shape.chunk(i, None if chat else "", finish_reason=openai_api.finish_reason(event),
                                           logprobs=lp, usage=usage(i)))

        self.start_event_stream()
        if chat and not await self.send("".join(
                data(shape.chunk(i, "", first=True, usage=usage(i))) for i in range(len(streams)))):
            return
        outcome = await self.relay(streams, render)
        if outcome is None:
            return
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
            return
        text = data(shape.usage_chunk(outcome)) if call.include_usage else ""
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
        self.finish(openai_api.models_list(info, self._created()))

    def _created(self) -> int:
        return int(wall(self.service.collector.started_at))


class ModelHandler(ModelsHandler):
    """``GET infer/v1/models/{id}``: the card of the served model (ids may hold ``/``)."""

    @web.authenticated
    @authorized
    @answers_errors
    async def get(self, model: str) -> None:
        info = await self.service.wait_ready()
        if model not in openai_api.model_names(info):
            raise NotFound(f"The model {show(model)} is not served here; GET infer/v1/models lists the one that is.")
        self.finish(openai_api.model_card(info, self._created()))


class TokenizeHandler(OpenAIHandler):
    """``POST infer/tokenize`` (vLLM's shape): ``{prompt}`` or ``{messages}`` →
    ``{count, max_model_len, tokens, token_strs}``, as the generate routes tokenize."""

    @web.authenticated
    @authorized("read")  # tokenizing runs no model: reading, though it is a POST
    @answers_errors
    async def post(self) -> None:
        info = await self.service.wait_ready()
        body = self.read_json()
        if not isinstance(body, dict):
            raise InvalidRequest("The request body must be a JSON object with 'prompt' or 'messages'.")
        if "messages" in body:
            prompt = await self.service.render_chat(openai_api.parse_messages(body))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise InvalidRequest("'prompt' must be a string (or send 'messages').", param="prompt")
        tokens = await self.service.tokenize(prompt)
        strs = self.service.token_texts(tokens) if body.get("return_token_strs") else None
        self.finish({"count": len(tokens), "max_model_len": info.max_context, "tokens": tokens, "token_strs": strs})


class DetokenizeHandler(OpenAIHandler):
    """``POST infer/detokenize`` (vLLM's shape): ``{tokens}`` → ``{prompt}``."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequest("'tokens' must be a list of token ids.", param="tokens")
        self.finish({"prompt": await self.service.detokenize(tokens)})


class NotFoundHandler(InferHandler):
    """Any other path under ``infer/``: a JSON 404 (jupyter_server would answer a redirect to
    its login page, or HTML), whatever the method."""

    def _not_found(self) -> None:
        raise web.HTTPError(404, f"No route {self.request.path}: docs/server.md lists this server's routes.")

    @web.authenticated
    def get(self, *args: Any) -> None:
        self._not_found()

    @web.authenticated
    def post(self, *args: Any) -> None:
        self._not_found()

    @web.authenticated
    def put(self, *args: Any) -> None:
        self._not_found()

    @web.authenticated
    def patch(self, *args: Any) -> None:
        self._not_found()

    @web.authenticated
    def delete(self, *args: Any) -> None:
        self._not_found()


class OpenAINotFoundHandler(OpenAIHandler, NotFoundHandler):
    """Any other path under ``infer/v1/``: the same 404, in OpenAI's shape."""

    def _not_found(self) -> None:
        raise web.HTTPError(404, f"No route {self.request.path}: this server offers v1/completions, "
                                 "v1/chat/completions and v1/models.")


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
        (r"/infer/v1/models/(.+)", ModelHandler),
        (r"/infer/v1/.*", OpenAINotFoundHandler),
        (r"/infer/health", HealthHandler),
        (r"/infer/tokenize", TokenizeHandler),
        (r"/infer/detokenize", DetokenizeHandler),
        (r"/infer/requests/([^/]+)", RequestHandler),
        (r"/infer/.*", NotFoundHandler),
    ]
