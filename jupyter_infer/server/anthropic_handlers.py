"""Anthropic's Messages API under ``<base_url>infer/v1/messages``: the same service, bodies
translated and answers rendered by ``wire/anthropic_messages``, errors in Anthropic's shape.

Auth is Jupyter's, as on every route. Anthropic's clients send the key as ``x-api-key`` (Claude
Code, older SDKs) or ``Authorization: Bearer`` (the SDK's ``auth_token``, and its newer
releases): an ``x-api-key`` is read as the Jupyter token. A browser cannot send that header to
another site without CORS allowing it, so it is as much a proof as the ``Authorization`` one.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import InferError
from ..values.request import RequestResult, TokenEvent
from ..values.stream import RequestStream
from ..wire import anthropic_messages
from .handler_base import GENERATE, InferHandler, answers_errors
from .sse import format_event

INVALID_KEY = ("Invalid or missing API key: use this Jupyter server's token as the API key "
               "(x-api-key: <token>, or Authorization: Bearer <token>).")


class AnthropicHandler(InferHandler):
    """Errors in Anthropic's ``{"type": "error", "error": {type, message}}``, for what we raise
    and for what tornado and jupyter_server raise (401 for a bad key, 404, 405); a late error
    in a stream is an ``error`` event."""

    unauthorized = INVALID_KEY

    async def prepare(self) -> None:  # type: ignore[override]
        headers = self.request.headers
        key = headers.get("x-api-key")
        if key and "Authorization" not in headers:  # read before jupyter_server looks for the token
            headers["Authorization"] = f"token {key}"
        await super().prepare()

    def no_user_is_401(self) -> bool:
        return True  # a refused key is 401 (the SDK's AuthenticationError), never jupyter_server's 403

    def get_login_url(self) -> str:
        raise web.HTTPError(401, INVALID_KEY)  # what @web.authenticated asks for without a user

    def error_body(self, err: InferError) -> dict[str, Any]:
        return anthropic_messages.error_json(err.status, err.message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.count_refusal(status_code)
        message = self.refusal_message(status_code, kwargs.get("exc_info", (None, None))[1])
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(anthropic_messages.error_json(status_code, message)))

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:
            self.write(format_event(json.dumps(self.error_body(err)), "error"))
            self.finish_event_stream()
            return
        super().write_infer_error(err)


def _events(events: list[anthropic_messages.Event]) -> str:
    return "".join(format_event(json.dumps(data), name) for name, data in events)


class MessagesHandler(AnthropicHandler):
    """``POST infer/v1/messages``: one answer, whole or as the stream of events."""

    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        info = await self.ready_for(body)
        call = anthropic_messages.parse_call(body, info, max_new_tokens=self.max_new_tokens)
        self.say_ignored(call.ignored)
        stream = await self.submit(call.request)
        model = stream.model or call.model  # behind a router: the model that serves it
        if call.stream:
            await self._stream(stream, model)
            return
        result = await self.whole_result(stream)
        if result is not None:
            self.finish(anthropic_messages.message(result, stream.id, model))

    async def _stream(self, stream: RequestStream, model: str) -> None:
        events = anthropic_messages.MessageEvents(stream.id, model, len(stream.prompt_ids))

        def render(_: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent):
                return _events(events.pieces(event.pieces))
            return _events(events.end(event))

        self.start_event_stream()
        if not await self.send(_events(events.start())):
            return
        outcome = await self.relay([stream], render)
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
        elif outcome is not None:
            self.finish_event_stream()


class CountTokensHandler(AnthropicHandler):
    """``POST infer/v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt the
    messages route would run (system, messages and tools, rendered by the chat template)."""

    @web.authenticated
    @authorized("read")  # counting runs no model: reading, though it is a POST
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        info = await self.service.wait_ready()
        prompt = await self.service.render_chat(anthropic_messages.count_request(body, info))
        self.finish({"input_tokens": len(await self.service.tokenize(prompt))})
