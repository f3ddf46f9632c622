"""The HTTP routes under ``<base_url>infer/``: validate → service → shape the answer.

Every verb is ``@web.authenticated`` + ``@authorized`` on the ``jupyter_infer`` resource:
reads (status, metrics, batches, events, models) need ``read``; generating needs ``execute``.
Errors a user can hit are ``InferError``s, answered as JSON ``{"message": ...}`` (OpenAI's
``{"error": {...}}`` under ``infer/v1/``) with their status; nothing is queued on bad input.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import InferError, InvalidRequest, NotFound, PayloadTooLarge, QueueFull
from ..metrics import wall
from ..request import Request, RequestResult, parse_generate_body
from ..scheduler import RequestStream
from ..service import InferenceService
from . import openai_api
from .sse import EventStreamHandler, format_event

AUTH_RESOURCE = "jupyter_infer"
SERVICE_KEY = "jupyter_infer.service"  # settings key of the one InferenceService
GENERATE = "execute"  # the auth action that running the model needs
_QUERY_INTS = {"max_tokens", "top_k", "seed", "priority"}
_QUERY_FLOATS = {"temperature", "top_p"}
_QUERY_IGNORED = {"token", "_xsrf", "no_track_activity"}

F = TypeVar("F", bound=Callable[..., Awaitable[None]])
T = TypeVar("T")


def answers_errors(method: F) -> F:
    """Turn an ``InferError`` into its status and JSON body (or an SSE error event, once
    the event stream has started)."""

    @functools.wraps(method)
    async def wrapper(self: InferHandler, *args: Any, **kwargs: Any) -> None:
        try:
            await method(self, *args, **kwargs)
        except InferError as err:
            self.write_infer_error(err)

    return wrapper  # type: ignore[return-value]


class InferHandler(EventStreamHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.keepalive_s = self.infer_config.sse_keepalive_s

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
        body = self.request.body or b""
        limit = self.infer_config.max_body_bytes
        if len(body) > limit:
            raise PayloadTooLarge(
                f"The request body is {len(body)} bytes, above this server's limit of {limit} "
                "(InferApp.max_body_bytes). Send a shorter prompt."
            )
        if not body.strip():
            raise InvalidRequest("The request body is empty: send a JSON object such as {\"prompt\": \"...\"}.")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise InvalidRequest(f"The request body is not valid JSON ({err}).") from None

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
                raise InvalidRequest(f"'{name}' must be a number; got {value!r}.", param=name) from None
        return body

    def parse(self, build: Callable[[], T]) -> T:
        """Run ``build`` (reading and checking the input); count a refusal in the metrics."""
        try:
            return build()
        except InferError as err:
            self.service.reject("too_large" if isinstance(err, PayloadTooLarge) else "invalid")
            raise

    async def submit(self, request: Request) -> RequestStream:
        stream = await self.service.submit(request)
        self._stream = stream  # cancelled if the client leaves
        if self.gone.is_set():  # it left while we waited for the engine to load
            stream.cancel()
        self.set_header("X-Request-Id", stream.id)
        if stream.route is not None:  # engine = "router": the backend that serves it
            self.set_header("X-Route", stream.route)
        return stream

    # -- output -----------------------------------------------------------------------------
    def error_body(self, err: InferError) -> dict[str, Any]:
        return {"message": err.message, "code": err.code, "param": err.param}

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
        if result.route is not None:  # a fallback may have moved it since submit
            self.set_header("X-Route", result.route)
        return None if self.gone.is_set() else result


class GenerateHandler(InferHandler):
    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        request = self.parse(lambda: parse_generate_body(self.read_json(), max_new_tokens=self.max_new_tokens))
        result = await self.whole_result(await self.submit(request))
        if result is not None:
            self.finish(result.to_json())


class GenerateStreamHandler(InferHandler):
    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self._generate(self.read_json)

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def get(self) -> None:
        await self._generate(self.query_body)

    async def _generate(self, read: Callable[[], Any]) -> None:
        request = self.parse(lambda: parse_generate_body(read(), max_new_tokens=self.max_new_tokens))
        await self.stream_tokens(await self.submit(request))


class StatusHandler(InferHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        status = self.service.status()
        # Clients time out a silent stream after a few keepalive intervals: tell them this one.
        status["limits"]["sse_keepalive_s"] = self.keepalive_s
        self.finish(status)


class MetricsHandler(InferHandler):
    @web.authenticated
    @authorized
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
        if not value.isdigit() or not 1 <= int(value) <= 10_000:
            raise InvalidRequest(f"'{name}' must be an integer from 1 to 10000; got {value!r}.", param=name)
        return int(value)


class EventsHandler(InferHandler):
    """Live scheduler events (queued, admitted, token, finished, batch, step) as SSE."""

    _track_activity = False  # a panel left open is not user activity

    @web.authenticated
    @authorized
    async def get(self) -> None:
        subscription = self.service.subscribe()
        try:
            self.start_event_stream()
            if not await self.send(""):
                return
            while True:
                event = await self.next_or_keepalive(subscription.get())
                if event is None or not await self.send(format_event(json.dumps(event), event["type"])):
                    break
                if event["type"] == "shutdown":
                    break
        finally:
            subscription.close()
        self.finish_event_stream()


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
        parsed = self.parse(lambda: parse(self.read_json(), info, max_new_tokens=self.max_new_tokens))
        stream = await self.submit(parsed.request)
        shape = openai_api.Shaper(chat, stream.id, stream.model or parsed.model, parsed.include_usage)
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
    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self.complete(openai_api.parse_completion, chat=False)


class ChatCompletionsHandler(OpenAIHandler):
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
            raise NotFound(f"No queued or running request has the id {request_id!r}; it may have finished.")
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
