"""OpenAI's Responses API under ``<base_url>infer/v1/responses`` (issue 56, item 1): the same
service, bodies translated and answers rendered by ``wire/openai_responses`` and
``wire/responses_events``, errors in OpenAI's shape; stored answers (``store``,
``previous_response_id``, ``GET``/``DELETE``) per user in ``response_store``."""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import InferError, InvalidRequest
from ..values.request import Request, RequestResult, TokenEvent
from ..values.stream import RequestStream
from ..wire import openai_responses
from ..wire.openai_responses import ResponsesCall, ResponseShape
from ..wire.responses_events import Event, ResponseEvents
from .handler_base import GENERATE, answers_errors
from .openai_handlers import OpenAIHandler
from .response_store import ResponseStore, StoredResponse, store_of
from .sse import format_event


def _events(events: list[Event]) -> str:
    return "".join(format_event(json.dumps(data), name) for name, data in events)


class ResponsesBase(OpenAIHandler):
    @property
    def store(self) -> ResponseStore:
        return store_of(self.settings)


class ResponsesHandler(ResponsesBase):
    """``POST infer/v1/responses``: one answer, whole or as the stream of events."""

    generates = True

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.events: ResponseEvents | None = None  # once the stream has started

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is not None:
            if not isinstance(previous, str):
                raise InvalidRequest("'previous_response_id' must be a response's id (a string).",
                                     param="previous_response_id")
            history = self.store.get(self.viewer.name, previous, "previous_response_id").conversation()
        info = await self.ready_for(body)
        call = openai_responses.parse_call(body, info, history, max_new_tokens=self.max_new_tokens)
        self.say_ignored(call.ignored)
        stream = await self._submit(call.request)
        shape = ResponseShape(call, stream.id, stream.model or call.model)  # behind a router: who serves it
        if call.stream:
            await self._stream(stream, shape)
            return
        result = await self.whole_result(stream)
        if result is not None:
            response = shape.whole(result)
            self._keep(call, response)
            self.finish(response)

    async def _submit(self, request: Request) -> RequestStream:
        try:
            return await self.submit(request)
        except InvalidRequest as err:  # the service's checks (max_tokens above the limit) in this API's words
            raise openai_responses.in_our_words(err) from None

    def _keep(self, call: ResponsesCall, response: dict[str, Any]) -> None:
        if call.store:  # its size: its own items' (those before are its predecessor's, shared)
            size = len(json.dumps(response)) + len(json.dumps(call.own_items))
            self.store.keep(self.viewer.name, StoredResponse(response, call.items, size))

    async def _stream(self, stream: RequestStream, shape: ResponseShape) -> None:
        events = self.events = ResponseEvents(shape)
        finished: list[dict[str, Any]] = []

        def render(_: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent):
                return _events(events.pieces(event.pieces))
            last, response = events.end(event)
            finished.append(response)
            return _events(last)

        self.start_event_stream()
        if not await self.send(_events(events.start())):
            return
        outcome = await self.relay([stream], render)
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
        elif outcome is not None:
            self._keep(shape.call, finished[0])
            self.finish_event_stream()

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming and self.events is not None:  # a late failure: OpenAI's error and response.failed
            self.write(_events(self.events.failed(err)))
            self.finish_event_stream()
            return
        super().write_infer_error(err)


class ResponseHandler(ResponsesBase):
    """``GET infer/v1/responses/{id}``: a stored response, as it was answered; ``DELETE``
    forgets it. Only its owner finds it."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def get(self, response_id: str) -> None:
        self.finish(self.store.get(self.viewer.name, response_id).response)

    @web.authenticated
    @authorized(GENERATE)  # it changes what a later request may continue: as writing as asking
    @answers_errors
    async def delete(self, response_id: str) -> None:
        self.store.delete(self.viewer.name, response_id)
        self.finish({"id": response_id, "object": "response", "deleted": True})


class InputItemsHandler(ResponsesBase):
    """``GET infer/v1/responses/{id}/input_items``: the items a stored response answered (the
    conversation before it, then its input), newest first unless ``order=asc``."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def get(self, response_id: str) -> None:
        stored = self.store.get(self.viewer.name, response_id)
        items = [openai_responses.listed_item(item, i) for i, item in enumerate(stored.items)]
        order = self.get_query_argument("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
        if order == "desc":
            items.reverse()
        self.finish({"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                     "last_id": items[-1]["id"] if items else None, "has_more": False})


ROUTES: list[tuple[str, type]] = [
    (r"/infer/v1/responses", ResponsesHandler),
    (r"/infer/v1/responses/([^/]+)", ResponseHandler),
    (r"/infer/v1/responses/([^/]+)/input_items", InputItemsHandler),
]
