"""llama-server's ``POST infer/infill`` (code completion between a prefix and a suffix), for
editor plugins written against it: bodies and answers in ``wire/llama_infill``, the request
an infill the engine writes in its model's fill-in-the-middle tokens."""

from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import InferError
from ..values.request import RequestResult, TokenEvent
from ..values.stream import RequestStream
from ..wire import llama_infill
from .handler_base import GENERATE, InferHandler, answers_errors


class InfillHandler(InferHandler):
    """One infill, whole or streamed as ``data:`` lines of llama-server's completion objects
    (the last one ``stop: true``, with the counts and timings)."""

    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        info = await self.ready_for(body)
        request, stream_it, ignored = llama_infill.parse_infill(body, max_new_tokens=self.max_new_tokens)
        self.say_ignored(ignored)
        stream = await self.submit(request)
        model = stream.model or info.model
        if stream_it:
            await self._stream(stream, model)
            return
        result = await self.whole_result(stream)
        if result is not None:
            self.finish(llama_infill.answer(result, model))

    async def _stream(self, stream: RequestStream, model: str) -> None:
        def render(_: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent):
                return f"data: {json.dumps(llama_infill.piece(event.text))}\n\n" if event.text else ""
            return f"data: {json.dumps(llama_infill.answer(event, model))}\n\n"

        self.start_event_stream()
        outcome = await self.relay([stream], render)
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
        elif outcome is not None:
            self.finish_event_stream()
