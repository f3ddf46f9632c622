"""``POST infer/v1/embeddings`` (OpenAI's) and ``infer/v1/rerank`` (llama-server's, vLLM's, Jina's):
each input an embedding request the engine runs in its steps beside the others
(``wire/embeddings``, ``wire/rerank``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.web import GZipContentEncoding

from ..values.engine_info import EngineInfo
from ..values.request import RequestResult
from ..values.stream import RequestStream
from ..wire import embeddings, rerank
from .handler_base import GENERATE, InferHandler, answers_errors
from .openai_handlers import OpenAIHandler


async def results_of(handler: InferHandler, streams: list[RequestStream]) -> list[RequestResult] | None:
    """Every stream's result, in order (``None``: the client left); the first failure raised."""
    results = await asyncio.gather(*(s.result() for s in streams))
    return None if handler.gone.is_set() else list(results)


def without_gzip(handler: InferHandler) -> None:
    """No gzip for an answer of vectors: numbers in JSON shrink little, and compressing half a
    megabyte cost the server ~8 % of a 64-text batch's time, the CPU the engine runs on."""
    handler._transforms = [t for t in handler._transforms if not isinstance(t, GZipContentEncoding)]


class VectorsHandler(OpenAIHandler):
    """A body read into embedding requests (``parse``), their results rendered (``render``)."""

    generates = True  # it runs the model: a cookie alone never starts it
    parse: Callable[[Any, EngineInfo], Any]
    render: Callable[[Any, list[RequestResult]], dict[str, Any]]

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        call = type(self).parse(body, await self.ready_for(body))
        self.say_ignored(call.ignored)
        without_gzip(self)
        results = await results_of(self, await self.submit_all(call.requests))
        if results is not None:
            self.finish(type(self).render(call, results))


class EmbeddingsHandler(VectorsHandler):
    parse, render = staticmethod(embeddings.parse_embeddings), staticmethod(embeddings.answer)


class RerankHandler(VectorsHandler):
    parse, render = staticmethod(rerank.parse_rerank), staticmethod(rerank.answer)
