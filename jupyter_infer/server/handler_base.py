"""What every route under ``<base_url>infer/`` shares: validate → service → shape the answer.

The routes themselves are in ``handlers`` (native, and the route table) and
``openai_handlers`` (OpenAI-compatible).

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
and a body that takes longer than ``body_timeout_s`` to arrive is answered 408 (in the route's
shape), after which the connection closes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from http.client import responses
from typing import Any, TypeVar

from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import (
    InferError,
    InvalidRequest,
    PayloadTooLarge,
    QueueFull,
    refusal_reason,
)
from ..service.inference import InferenceService
from ..values.engine_info import EngineInfo
from ..values.request import Request, RequestResult, TokenEvent, show
from ..values.stream import RequestStream
from ..wire.native import native_answer
from .http_errors import UNAUTHORIZED, BodyTimeout, HTTPFailure, as_infer_error
from .sse import EventStreamHandler, format_event
from .viewer import Viewer, hub_model, owner_weight, user_name

# jupyter_server's own identity providers: anyone with the server's token (or password) is
# its one user, seen as a fresh anonymous user on each token-only request.
SINGLE_USER_PROVIDERS = (IdentityProvider, PasswordIdentityProvider)
SINGLE_OWNER = "local"  # the owner of every request on a single-user server (and in a kernel)
AUTH_RESOURCE = "jupyter_infer"
SERVICE_KEY = "jupyter_infer.service"  # settings key of the one InferenceService
GENERATE = "execute"  # the auth action that running the model needs
_QUERY_INTS = {"max_tokens", "top_k", "seed", "priority", "min_tokens"}
_QUERY_FLOATS = {"temperature", "top_p", "repetition_penalty", "frequency_penalty", "presence_penalty"}
_QUERY_FLAGS = {"ignore_eos"}
_QUERY_IGNORED = {"token", "_xsrf", "no_track_activity"}
# tornado's own body timeout, past ours: it closes without an answer, so it only backs up
# the 408 (a loop too busy to run our timer, a client that never reads its answer).
BODY_TIMEOUT_BACKSTOP_S = 5.0

F = TypeVar("F", bound=Callable[..., Awaitable[None]])
log = logging.getLogger(__name__)
# A line per generating request (InferHandler.access_line); its level makes it easy to silence.
access_log = logging.getLogger("jupyter_infer.access")


def answers_errors(method: F) -> F:
    """Answer any exception of ``method`` as a JSON error in the route's shape (or an SSE
    error event, once the event stream has started)."""

    @functools.wraps(method)
    async def wrapper(self: InferHandler, *args: Any, **kwargs: Any) -> None:
        if self._finished:
            return  # refused while its body was arriving
        self.stop_body_clock()  # the body has arrived: the verb runs only then
        try:
            await method(self, *args, **kwargs)
        except StreamClosedError:
            pass  # the client left: nobody to answer
        except Exception as err:
            self.answer_error(as_infer_error(err))

    return wrapper  # type: ignore[return-value]


MAX_TOKENS_BOUND = 2**31 - 1  # what max_tokens may say where the server sets no limit of its own
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
        self._body_clock: asyncio.TimerHandle | None = None  # answers 408 if the body is too slow

    def check_xsrf_cookie(self) -> None:
        # jupyter_server checks XSRF on a POST whose token did not authenticate it; for a
        # client that sent no token, or a wrong one, the truth is 401 and what to send, not
        # "'_xsrf' argument missing from POST".
        if hasattr(self, "_jupyter_current_user") and self.current_user is None and self.no_user_is_401():
            raise web.HTTPError(401, self.unauthorized)
        super().check_xsrf_cookie()

    unauthorized = UNAUTHORIZED  # what a 401 says (the OpenAI routes speak of an API key)

    def no_user_is_401(self) -> bool:
        """No user means no valid token here; under JupyterHub it may also be a token the hub
        knows without the scope for this service, which stays the hub's 403."""
        return not type(self.identity_provider).__module__.startswith("jupyterhub")

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
        timeout = self.infer_config.body_timeout_s
        if "Transfer-Encoding" in self.request.headers or declared not in ("", "0"):
            self._body_clock = asyncio.get_running_loop().call_later(timeout, self._body_too_slow, timeout)
        set_body_timeout = getattr(self.request.connection, "set_body_timeout", None)
        if set_body_timeout is not None:
            set_body_timeout(timeout + BODY_TIMEOUT_BACKSTOP_S)

    def _body_too_slow(self, timeout: float) -> None:
        """The body is still arriving after ``timeout`` s: answer 408; tornado then closes the
        connection, since the request was answered before its body was read."""
        self._body_clock = None
        if self._finished:
            return
        self._body = bytearray()
        self.set_header("Connection", "close")
        try:
            self.answer_error(BodyTimeout(
                f"The request body took longer than {timeout:g} s to arrive "
                "(InferApp.body_timeout_s), so it was not read. Send the whole body at once, "
                "without pauses; over a slow link, ask the server's admin to raise the limit."
            ))
        except StreamClosedError:
            pass  # the client left meanwhile

    def stop_body_clock(self) -> None:
        """The body has arrived (``answers_errors`` calls this as the verb starts: a verb that
        reads a body must be wrapped by it), or the request is over."""
        if self._body_clock is not None:
            self._body_clock.cancel()
            self._body_clock = None

    def on_finish(self) -> None:
        self.stop_body_clock()
        super().on_finish()
        if self.generates:
            access_log.info("%s", self.access_line())

    def access_line(self) -> str:
        """One line per generating request, as a server's access log has it: the method and
        route, the status, who asked, the tokens in and out, and how long it took."""
        records = [s.record for s in self.request_streams if s.record is not None]
        tokens = (f" tokens={sum(r.prompt_tokens for r in records[:1])}+{sum(r.completion_tokens for r in records)}"
                  if records else "")
        user = self.viewer.name if self.current_user is not None else "-"
        return (f"jupyter_infer | {self.request.method} {self.request.path} {self.get_status()} user={user}"
                f"{tokens} {1000 * self.request.request_time():.0f} ms")

    def on_connection_close(self) -> None:
        self.stop_body_clock()
        super().on_connection_close()

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
        # 0: no limit of ours (the context bounds an answer, checked once the prompt is tokenized).
        return self.service.limits.max_new_tokens or MAX_TOKENS_BOUND

    # -- who is asking ----------------------------------------------------------------------
    @functools.cached_property
    def viewer(self) -> Viewer:
        """The authenticated user as an owner of requests. On a single-user server (jupyter_server's
        own token or password auth) everyone with the token is its one user, ``local``, who
        sees everything; through JupyterHub (or another identity provider) the user's name,
        seeing everything only as an admin (``InferApp.admin_users`` or a hub admin)."""
        if type(self.identity_provider) in SINGLE_USER_PROVIDERS:
            return Viewer(SINGLE_OWNER, sees_all=True)
        user, hub = self.current_user, hub_model(self.current_user)
        name = user_name(user) or SINGLE_OWNER
        if hub.get("kind") == "service":  # a hub service's token: never taken for a user of that name
            name = f"service:{name}"
        admin = name in self.service.config.admin_users or hub.get("admin") is True
        return Viewer(name, sees_all=admin)

    @property
    def owner_weight(self) -> float:
        groups = hub_model(self.current_user).get("groups") or []
        return owner_weight(self.viewer.name, [g for g in groups if isinstance(g, str)],
                            dict(self.service.config.fair_share_weights))

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

    def say_ignored(self, names: list[str]) -> None:
        """Name the body's fields this route accepted but does not act on (``X-Ignored-Fields``):
        as sent, escaped and cut short, so that any name makes a valid header."""
        if names:
            shown = [json.dumps(show(name) if len(name) > 60 else name)[1:-1] for name in names[:20]]
            self.set_header("X-Ignored-Fields", ", ".join(shown) + (", ..." if len(names) > 20 else ""))

    def refusal_message(self, status_code: int, err: BaseException | None) -> str:
        """What a dialect's error body says of an error tornado or jupyter_server raised: its
        message, what a 405 refuses, never a bug's own text."""
        if status_code == 405:
            return f"{self.request.method} is not allowed on {self.request.path}."
        if status_code >= 500 and not isinstance(err, web.HTTPError):
            return "The server failed on this request; see its log."
        return getattr(err, "log_message", None) or self._reason

    async def ready_for(self, body: Any) -> EngineInfo:
        """What serves a body that may name a model: that listed model brought first (loaded on
        demand, its turn waited for; or a 404 saying how to load it), then the engine's info."""
        shelf = getattr(self.service, "models", None)
        named = body.get("model") if isinstance(body, dict) else None
        if shelf is not None and isinstance(named, str):
            if (side := await shelf.resident(named)) is not None:  # beside the loaded one (max_loaded_models)
                return await side.wait_ready()
            await shelf.bring(named)
        return await self.service.wait_ready()

    async def submit_all(self, requests: list[Request]) -> list[RequestStream]:
        """Queue every request, or none: if one is refused, those already queued are
        cancelled and the refusal is raised. Each is owned by the authenticated user."""
        owner, weight = self.viewer.name, self.owner_weight
        self._handed_over = True  # from here on the service counts a refusal
        try:
            for request in requests:
                request = replace(request, owner=owner, owner_weight=weight)
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

    async def stream_tokens(self, stream: RequestStream, request: Request) -> None:
        """The contract's SSE: ``token`` events, then ``result`` (the native answer, as
        ``infer/generate`` gives it) and ``done``, or ``error``."""
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
        await self.send(format_event(json.dumps(native_answer(outcome[0], request, stream)), "result", stream.id)
                        + format_event("[DONE]", "done", stream.id))
        self.finish_event_stream()

    async def whole_result(self, stream: RequestStream) -> RequestResult | None:
        """Wait for the whole result; ``None`` if the client left meanwhile."""
        result = await stream.result()
        if result.route is not None:  # a fallback may have moved it since submit
            self.set_header("X-Route", result.route)
        return None if self.gone.is_set() else result


class NotFoundHandler(InferHandler):
    """Any other path under ``infer/``: a JSON 404 (jupyter_server would answer a redirect to
    its login page, or HTML), whatever the method."""

    def _not_found(self) -> None:
        raise web.HTTPError(404, f"No route {self.request.path}: docs/server.md lists this server's routes.")

    @web.authenticated
    def get(self, *args: Any) -> None:
        self._not_found()

    post = put = patch = delete = get
