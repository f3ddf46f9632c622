"""Rerank bodies in and ranked documents out, in the shape llama-server, vLLM, Jina and Cohere
share (``POST infer/v1/rerank``): ``query``, ``documents`` (strings, or ``{"text"}`` objects),
``top_n``, ``return_documents`` → ``results`` sorted by ``relevance_score``.

A reranker checkpoint (a cross-encoder: ``EngineInfo.details["task"] == "rerank"``) reads the
query and each document together; a document's relevance is the sigmoid of its one logit (as
sentence-transformers' ``CrossEncoder`` and vLLM score them). Any other model: the cosine of the
document's embedding and the query's, from the served model's own vectors (``wire/embeddings``:
an embedding model's pooling, a causal LM's last token). Either way every document is a request
batched in the engine's steps."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from ..values.engine_info import EngineInfo
from ..values.request import Request, RequestResult, SamplingParams, show
from .embeddings import MAX_INPUTS, embedding_requests
from .openai_requests import ignored_fields, served_name

RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "max_chunks_per_doc"}


@dataclass
class RerankCall:
    """A parsed rerank call: the query's request first, then one per document."""

    requests: list[Request]
    documents: list[str]
    model: str
    top_n: int
    pairs: bool = False  # a cross-encoder's: a request per document, no query vector
    return_documents: bool = True
    ignored: list[str] = field(default_factory=list)


def _documents(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'documents' must be a non-empty list of strings (or {{\"text\": ...}} objects); "
                             f"got {show(value)}.", param="documents")
    if len(value) >= MAX_INPUTS:
        raise InvalidRequest(f"'documents' holds {len(value)}; at most {MAX_INPUTS - 1} a call.", param="documents")
    texts = []
    for i, doc in enumerate(value):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"documents[{i}] must be a non-empty string or {{\"text\": ...}}; got {show(doc)}.",
                                 param="documents")
        texts.append(text)
    return texts


def parse_rerank(body: Any, info: EngineInfo) -> RerankCall:
    """A rerank body → the query's and the documents' embedding requests."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object with 'query' and 'documents'.")
    model = served_name(body, info)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidRequest(f"'query' must be a non-empty string; got {show(query)}.", param="query")
    documents = _documents(body.get("documents"))
    top_n = body.get("top_n")
    if top_n is None:
        top_n = len(documents)
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise InvalidRequest(f"'top_n' must be a positive integer; got {show(top_n)}.", param="top_n")
    keep = body.get("return_documents", True)
    if not isinstance(keep, bool):
        raise InvalidRequest("'return_documents' must be true or false.", param="return_documents")
    pairs = info.details.get("task") == "rerank"
    if pairs:
        requests = [Request(prompt=query, pair=doc, params=SamplingParams(max_tokens=0), embed=True,
                            model=body.get("model")) for doc in documents]
    else:
        requests = embedding_requests([query, *documents], body.get("model"))
    return RerankCall(requests, documents, model, min(top_n, len(documents)), pairs, keep,
                      ignored_fields(body, RERANK_FIELDS))


def answer(call: RerankCall, results: list[RequestResult]) -> dict[str, Any]:
    """The documents ranked by relevance, the best first, ``top_n`` of them."""
    if call.pairs:
        scores = [1 / (1 + math.exp(-(r.embedding or (0.0,))[0])) for r in results]
    else:
        query = results[0].embedding or ()
        scores = [sum(q * d for q, d in zip(query, r.embedding or (), strict=True)) for r in results[1:]]
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: call.top_n]
    tokens = sum(r.prompt_tokens for r in results)
    return {
        "id": f"rerank-{uuid.uuid4().hex[:16]}", "object": "list", "model": call.model,
        "results": [{"index": i, "relevance_score": round(scores[i], 6),
                     **({"document": {"text": call.documents[i]}} if call.return_documents else {})} for i in ranked],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
