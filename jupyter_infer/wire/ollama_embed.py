"""Ollama's embedding routes: ``api/embed`` (``input`` a string or a list; ``{"embeddings":
[[...]]}``) and the older ``api/embeddings`` (``prompt``; ``{"embedding": [...]}``), read as
the embedding requests ``wire/embeddings`` makes, one per input, run in the engine's steps.

``truncate`` is read and not acted on: an input longer than the model's context is a 400 that
says so, never cut silently."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from ..values.request import Request, RequestResult, show
from .embeddings import embedding_requests, inputs, shortened

EMBED_FIELDS = {"model", "input", "truncate", "options", "keep_alive", "dimensions"}
LEGACY_FIELDS = {"model", "prompt", "options", "keep_alive"}


@dataclass
class OllamaEmbedCall:
    requests: list[Request]
    model: str
    dimensions: int | None = None
    legacy: bool = False
    ignored: list[str] = field(default_factory=list)


def parse_embed(body: Any, model: str) -> OllamaEmbedCall:
    """``api/embed`` (``input``) or, with ``prompt``, ``api/embeddings``; ``model``: the served
    name the body's model stands for."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object with 'model' and 'input'.", param="body")
    legacy = "prompt" in body and "input" not in body
    if legacy:
        items = inputs(body.get("prompt"), "prompt")
        if len(items) != 1:
            raise InvalidRequest("'prompt' must be one string here; send several as 'input' to api/embed.",
                                 param="prompt")
    else:
        items = inputs(body.get("input"))
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidRequest(f"'dimensions' must be a positive integer; got {show(dimensions)}.", param="dimensions")
    ignored = sorted(set(body) - (LEGACY_FIELDS if legacy else EMBED_FIELDS)) + \
        [name for name in ("options", "keep_alive", "truncate") if name in body]
    return OllamaEmbedCall(embedding_requests(items, model), model, dimensions, legacy, ignored)


def answer(call: OllamaEmbedCall, results: list[RequestResult], total_ns: int) -> dict[str, Any]:
    """Ollama's answer: the vectors (normalized, as Ollama's are), the prompt tokens, the time."""
    vectors = [shortened(r.embedding or (), call.dimensions) for r in results]
    if call.legacy:
        return {"embedding": vectors[0]}
    return {"model": call.model, "embeddings": vectors, "total_duration": total_ns, "load_duration": 0,
            "prompt_eval_count": sum(r.prompt_tokens for r in results)}
