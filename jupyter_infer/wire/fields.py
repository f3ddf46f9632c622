"""The fields every request body shares, checked one by one: sampling (``parse_sampling``),
the prompt, and the native ``/infer/generate`` body (``parse_generate_body``).

Every front (the native routes, the OpenAI routes) reads its body through these, so the same
bad input gets the same message, before anything is enqueued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..constraints.spec import CONSTRAINT_FIELDS
from ..errors import InvalidRequest
from ..values.request import (
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    Request,
    SamplingParams,
    check_text,
    short,
    show,
)

SAMPLING_FIELDS = {
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "min_tokens", "ignore_eos",
    "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
}
GENERATE_FIELDS = SAMPLING_FIELDS | CONSTRAINT_FIELDS | {"prompt", "priority", "model", "messages", "tools",
                                                         "tool_choice", "parallel_tool_calls"}


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{name}' must be a number between {lo} and {hi}.", param=name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"'{name}' must be between {lo} and {hi}; got {show(value)}.", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON from some clients writes 5 as 5.0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer between {lo} and {hi}.", param=name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"'{name}' must be between {lo} and {hi}; got {show(value)}.", param=name)
    return value


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be true or false; got {show(value)}.", param=name)
    return value


def parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest("'stop' must be a string or a list of strings.", param="stop")
    value = list(dict.fromkeys(s for s in value if s))  # "" can never match: drop it
    if len(value) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(
            f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences; got {len(value)}.", param="stop"
        )
    if max(map(len, value), default=0) > MAX_STOP_CHARS:
        raise InvalidRequest(f"A 'stop' sequence may hold at most {MAX_STOP_CHARS} characters.", param="stop")
    return tuple(check_text(s, "stop") for s in value)


def parse_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` (bias from -100 to 100) as sorted pairs."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("'logit_bias' must be an object mapping token ids to biases.", param="logit_bias")
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"'logit_bias' keys must be token ids; got {show(key)}.", param="logit_bias") from None
        if token < 0 or isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidRequest(
                f"'logit_bias' maps token ids (0 or more) to numbers from -100 to 100; got {show(key)}: {show(bias)}.",
                param="logit_bias",
            )
        if bias:
            pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def parse_sampling(
    body: Mapping[str, Any], *, max_new_tokens: int, default_max_tokens: int | None = 64,
    default_temperature: float = 0.0, defaults: Mapping[str, float] | None = None,
) -> SamplingParams:
    """Sampling parameters from a JSON body (the service checks them against its limits).
    Every neutral value (``0``, ``0.0``, ``1.0`` for ``repetition_penalty``) is accepted.
    ``defaults``: the model's own values for the fields the body leaves out (its generation
    config: ``EngineInfo.sampling_defaults``)."""
    defaults = {"temperature": default_temperature, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0,
                **(defaults or {})}
    max_tokens = body.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, float) and max_tokens.is_integer():
        max_tokens = int(max_tokens)
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        raise InvalidRequest(
            f"'max_tokens' must be an integer from 0 to {max_new_tokens}; got {show(max_tokens)}.",
            param="max_tokens",
        )
    top_k = _integer(body, "top_k", int(defaults["top_k"]), -1, 100_000) or 0
    min_tokens = _integer(body, "min_tokens", 0, 0, max_new_tokens) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"'min_tokens' ({min_tokens}) is above 'max_tokens' ({max_tokens}).", param="min_tokens"
        )
    # 1.0 is no penalty; 0 (which clients send meaning "none") is taken as 1.0 too.
    repetition_penalty = _number(body, "repetition_penalty", defaults["repetition_penalty"], 0.0, 10.0) or 1.0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults["temperature"], 0.0, 2.0),
        top_p=_number(body, "top_p", defaults["top_p"], 0.0, 1.0),
        top_k=max(top_k, 0),  # vLLM's -1 and 0 both mean "no top-k"
        seed=_integer(body, "seed", None, -(2**63), 2**64 - 1),
        stop=parse_stop(body.get("stop")),
        min_tokens=min_tokens,
        ignore_eos=_flag(body, "ignore_eos"),
        repetition_penalty=repetition_penalty,
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        logit_bias=parse_logit_bias(body.get("logit_bias")),
    )


def check_prompt(prompt: Any, name: str = "prompt") -> str:
    if not isinstance(prompt, str):
        raise InvalidRequest(f"'{name}' must be a string.", param=name)
    if not prompt.strip():
        raise InvalidRequest(f"'{name}' is empty: send some text to complete.", param=name)
    return prompt


def parse_generate_body(body: Any, *, max_new_tokens: int) -> Request:
    """Build a ``Request`` from the body of ``POST infer/generate``; raise ``InvalidRequest``."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"Unknown field(s): {', '.join(map(short, unknown))}. Allowed: {', '.join(sorted(GENERATE_FIELDS))}.",
            param=short(unknown[0]),
        )
    prompt = check_prompt(body.get("prompt"))
    params = parse_sampling(body, max_new_tokens=max_new_tokens)
    priority = _integer(body, "priority", 0, -1000, 1000) or 0
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string (see GET infer/v1/models).", param="model")
    return Request(prompt=prompt, params=params, priority=priority, model=model)
