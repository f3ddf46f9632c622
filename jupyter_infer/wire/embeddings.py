"""Embedding bodies in and vectors out: OpenAI's ``v1/embeddings`` (``input`` a string, a list
of them, token ids or lists of them; ``encoding_format`` float or base64; ``dimensions``) and
the requests they mean: one ``Request`` per input, ``embed=True``, which the engine runs
beside the others' steps and ends with its vector. Ollama's ``embed`` reads the same way."""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from ..values.engine_info import EngineInfo
from ..values.request import Request, RequestResult, SamplingParams, show
from .openai_requests import ignored_fields, served_name

EMBEDDING_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}
MAX_INPUTS = 2048  # OpenAI's bound on one call's inputs


@dataclass
class EmbeddingCall:
    """A parsed embeddings call: a request per input, and how to shape the answer."""

    requests: list[Request]
    model: str
    encoding: str = "float"
    dimensions: int | None = None
    ignored: list[str] = field(default_factory=list)


def inputs(value: Any, name: str = "input") -> list[str | list[int]]:
    """``input`` as a list of texts or token-id lists (a string, a list of strings, a token-id
    list, a list of those)."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'{name}' must be a string, a non-empty list of strings, or token ids; got "
                             f"{show(value)}.", param=name)
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'{name}' holds {len(value)} inputs; at most {MAX_INPUTS} a call.", param=name)
    for i, item in enumerate(value):
        texts = isinstance(item, str) and item != ""
        ids = isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        if not (texts or ids):
            raise InvalidRequest(f"{name}[{i}] must be a non-empty string or a non-empty list of token ids; got "
                                 f"{show(item)}.", param=name)
    return value


def embedding_requests(items: list[str | list[int]], model: str | None) -> list[Request]:
    """One embedding request per input (no token to write: ``max_tokens`` 0)."""
    params = SamplingParams(max_tokens=0)
    return [Request(prompt=item, params=params, embed=True, model=model) if isinstance(item, str)
            else Request(prompt="", prompt_ids=item, params=params, embed=True, model=model) for item in items]


def parse_embeddings(body: Any, info: EngineInfo) -> EmbeddingCall:
    """``POST infer/v1/embeddings`` → a request per input; ``InvalidRequest`` for what it cannot be."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object with 'input'.")
    model = served_name(body, info)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"'encoding_format' must be 'float' or 'base64'; got {show(encoding)}.",
                             param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidRequest(f"'dimensions' must be a positive integer; got {show(dimensions)}.", param="dimensions")
    requests = embedding_requests(inputs(body.get("input")), body.get("model"))
    return EmbeddingCall(requests, model, encoding, dimensions, ignored_fields(body, EMBEDDING_FIELDS))


def shortened(vector: tuple[float, ...], dimensions: int | None) -> list[float]:
    """The vector's first ``dimensions`` (a Matryoshka-trained model's shorter embedding),
    normalized again; a 400 above the model's size."""
    if dimensions is None or dimensions == len(vector):
        return list(vector)
    if dimensions > len(vector):
        raise InvalidRequest(f"'dimensions' is {dimensions}, above this model's {len(vector)}.", param="dimensions")
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's (and its SDK decodes them so)
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    # Nine decimals: a unit vector's float32 components to their own precision, in about half
    # the characters of a float64's shortest form (a batch's answer is that much less to send).
    return [round(v, 9) for v in vector]


def answer(call: EmbeddingCall, results: list[RequestResult]) -> dict[str, Any]:
    """OpenAI's list of embeddings, in the inputs' order, with the prompts' token count."""
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(shortened(r.embedding or (), call.dimensions), call.encoding)}
            for i, r in enumerate(results)]
    tokens = sum(r.prompt_tokens for r in results)
    return {"object": "list", "data": data, "model": call.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
