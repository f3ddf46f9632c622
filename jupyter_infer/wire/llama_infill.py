"""llama-server's code infill route (``POST infer/infill``): a translator, for the editor
plugins written against it (llama.vim, llama.vscode) and Ollama-less code completion.

A body names the code before the cursor (``input_prefix``, then ``prompt``: the current line's
start, which llama-server appends to it), the code after it (``input_suffix``) and the
project's other files (``input_extra``: ``[{"filename", "text"}]``); the request is an infill
(``Request.suffix``), written in the model's own fill-in-the-middle tokens where it is
tokenized. Answers are llama-server's completion objects (``content``, ``stop``,
``stop_type``, ``tokens_predicted``, ``tokens_evaluated``, ``timings``), streamed as
``data:`` lines of the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequest
from ..values.request import Request, RequestResult, show
from .fields import parse_sampling

# Fields acted on (the sampling ones in our spelling after _ours); the rest are named as ignored.
INFILL_FIELDS = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens", "temperature",
                 "top_k", "top_p", "min_p", "seed", "stop", "stream", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "model", "cache_prompt"}
INFILL_DEFAULT_TOKENS = 128  # llama-server's -1 (no bound) would let a completion run to the context's end


def _ours(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields in the names ``parse_sampling`` reads (llama-server's ``n_predict``:
    ``max_tokens``, -1 meaning the default; ``repeat_penalty``: ``repetition_penalty``)."""
    fields = {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed", "stop",
                                   "presence_penalty", "frequency_penalty") if k in body}
    n_predict = body.get("n_predict", body.get("max_tokens"))
    if n_predict is not None and n_predict != -1:
        fields["max_tokens"] = n_predict
    if "repeat_penalty" in body:
        fields["repetition_penalty"] = body["repeat_penalty"]
    return fields


def _files(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest("'input_extra' must be a list of {\"filename\", \"text\"} objects.", param="input_extra")
    files = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidRequest(f"input_extra[{i}] must be an object with a 'text' string (and a "
                                 f"'filename'); got {show(chunk)}.", param="input_extra")
        name = chunk.get("filename", "")
        if not isinstance(name, str):
            raise InvalidRequest(f"input_extra[{i}].filename must be a string.", param="input_extra")
        files.append((name, chunk["text"]))
    return tuple(files)


def _code(body: Mapping[str, Any], name: str) -> str:
    """A piece of code (empty or only indentation is fine: it is where the cursor is)."""
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string; got {show(value)}.", param=name)
    return value


def parse_infill(body: Any, *, max_new_tokens: int) -> tuple[Request, bool, list[str]]:
    """An infill body as the request it means, whether to stream, and the fields it ignores;
    ``InvalidRequest`` for what it cannot be."""
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object with 'input_prefix' and 'input_suffix'.")
    before = _code(body, "input_prefix") + _code(body, "prompt")
    after = _code(body, "input_suffix")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    params = parse_sampling(_ours(body), max_new_tokens=max_new_tokens, default_max_tokens=INFILL_DEFAULT_TOKENS)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    request = Request(prompt=before, params=params, suffix=after, context_files=_files(body.get("input_extra")),
                      model=model)
    return request, stream, sorted(set(body) - INFILL_FIELDS)


def _stop_type(result: RequestResult) -> str:
    if result.stop_sequence is not None:
        return "word"
    return "limit" if result.finish_reason == "length" else "eos"


def answer(result: RequestResult, model: str) -> dict[str, Any]:
    """A finished infill as llama-server's completion object."""
    generating_s = max(result.total_ms - (result.ttft_ms or 0.0), 0.0) / 1000
    return {
        "content": result.text, "stop": True, "stop_type": _stop_type(result),
        "stopping_word": result.stop_sequence or "", "model": model,
        "tokens_predicted": result.completion_tokens, "tokens_evaluated": result.prompt_tokens,
        "tokens_cached": 0, "truncated": False,
        "timings": {"prompt_n": result.prompt_tokens, "prompt_ms": round(result.ttft_ms or 0.0, 2),
                    "predicted_n": result.completion_tokens, "predicted_ms": round(generating_s * 1000, 2),
                    "predicted_per_second": round(result.completion_tokens / generating_s, 2) if generating_s else None},
    }


def piece(text: str) -> dict[str, Any]:
    """A streamed fragment (``stop`` false until the last object, which is ``answer``'s)."""
    return {"content": text, "stop": False}
