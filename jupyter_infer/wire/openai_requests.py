"""OpenAI request bodies in: ``v1/completions`` and ``v1/chat/completions`` bodies become
``Request``s (one per choice); the answers' shapes are in ``openai_answers``.

Tolerant as vLLM is: a field this server does not act on is ignored (logged once per name,
and named in the ``X-Ignored-Fields`` header of the answer), never a 400. Fields that change
the answer are implemented (sampling extras, ``n``, several prompts, token-id prompts,
``logprobs``, ``echo``, structured outputs and tool calls: ``constraints/``); the few it
cannot honour (``best_of`` above ``n``) are refused with a 400 that says so,
never silently dropped.
Each choice becomes its own ``Request``, so the choices of one call batch together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..constraints import spec as constraint_spec
from ..constraints.tools import ToolSet
from ..errors import InvalidRequest, UnknownModel
from ..values.engine_info import EngineInfo
from ..values.request import MAX_LOGPROBS, Request, SamplingParams, show
from .chat import parse_chat_and_tools
from .fields import SAMPLING_FIELDS, check_prompt, parse_sampling

log = logging.getLogger(__name__)

OPENAI_DEFAULT_TEMPERATURE = 1.0
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions route

# Fields each route acts on, or accepts knowing they change nothing (user, metadata, ...).
_COMMON = SAMPLING_FIELDS | constraint_spec.OPENAI_FIELDS | {
    "model", "stream", "stream_options", "n", "user", "metadata", "store", "service_tier"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix", "max_completion_tokens"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                         "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
                         "chat_template_kwargs"}
_logged_ignored: set[str] = set()  # at most _LOG_IGNORED_MAX names: a client may send any
_LOG_IGNORED_MAX = 100


@dataclass
class OpenAIRequest:
    """A parsed call: one ``Request`` per choice, in choice order (prompt by prompt, ``n``
    choices each), and how to shape the answer."""

    requests: list[Request]
    model: str
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    n: int = 1
    echo: bool = False
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    ignored: list[str] = field(default_factory=list)
    tools: ToolSet | None = None  # the answer may be tool calls (chat)


def ignored_fields(body: Mapping[str, Any], allowed: set[str]) -> list[str]:
    """The fields of ``body`` this route does not act on (each logged once per process)."""
    ignored = sorted(set(body) - allowed)
    for name in ignored:
        if name not in _logged_ignored and len(_logged_ignored) < _LOG_IGNORED_MAX:
            _logged_ignored.add(name)
            log.info("jupyter_infer: ignoring the OpenAI request field %s (not acted on here)", show(name))
    return ignored


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def served_name(body: Mapping[str, Any], info: EngineInfo) -> str:
    """The served model's own name for a body's ``model`` (left out: the served one); a 404
    for a model not served here."""
    names = info.model_names()
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a model's name (a string); got {show(model)}.", param="model")
    if model not in names:
        raise UnknownModel(
            f"The model {show(model)} is not served here; use {names[0]!r} "
            f"(see GET infer/v1/models).", param="model",
        )
    return names[0]


def _requested(request: Request, body: Mapping[str, Any]) -> Request:
    """Keep the model the client named (a router routes by it)."""
    return replace(request, model=body.get("model"))


def _check_stream(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """``stream``, ``include_usage``, ``continuous_usage_stats`` (the options are ignored
    without a stream)."""
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    options = body.get("stream_options")
    if not stream or options is None:
        return stream, False, False
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object such as {\"include_usage\": true}.",
                             param="stream_options")
    flags = []
    for name in ("include_usage", "continuous_usage_stats"):
        value = options.get(name) or False
        if not isinstance(value, bool):
            raise InvalidRequest(f"'stream_options.{name}' must be true or false.", param="stream_options")
        flags.append(value)
    return stream, flags[0], flags[1]


def _check_n(body: Mapping[str, Any], max_choices: int) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_choices:
        raise InvalidRequest(f"'n' must be an integer from 1 to {max_choices}; got {show(n)}.", param="n")
    return n


def parse_prompts(value: Any) -> list[str | list[int]]:
    """OpenAI's four prompt forms: a string, a list of strings, a list of token ids, or a
    list of token-id lists. A string is text; a list of ints is token ids."""

    def ids(item: Any) -> bool:
        return isinstance(item, list) and bool(item) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in item)

    if isinstance(value, str):
        return [check_prompt(value)]
    if isinstance(value, list) and value:
        if ids(value):
            return [list(value)]
        if all(isinstance(p, str) for p in value):
            return [check_prompt(p, f"prompt[{i}]") for i, p in enumerate(value)]
        if all(ids(p) for p in value):
            return [list(p) for p in value]
    raise InvalidRequest(
        "'prompt' must be a string, a list of strings, a list of token ids, or a list of "
        "non-empty token-id lists.", param="prompt",
    )


def _logprobs(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None or value is False:
        return None
    if value is True:
        return 1  # as pydantic reads true for an int field (vLLM)
    if not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise InvalidRequest(f"'{name}' must be an integer from 0 to {MAX_LOGPROBS}; got {show(value)}.", param=name)
    return value


def _choices(prompts: list[Any], n: int, params: SamplingParams, make: Callable[[Any, SamplingParams], Request],
             max_choices: int) -> list[Request]:
    total = len(prompts) * n
    if total > max_choices:
        raise InvalidRequest(
            f"This call asks for {total} choices ({len(prompts)} prompt(s) x n={n}), above this "
            f"server's limit of {max_choices} (InferApp.max_choices). Split it.", param="prompt",
        )
    out = []
    for prompt in prompts:
        for j in range(n):
            # Choices of one prompt with one seed must still differ: vLLM seeds choice j with seed + j.
            seed = params.seed if params.seed is None or j == 0 else (params.seed + j) % 2**64
            out.append(make(prompt, replace(params, seed=seed)))
    return out


def _suffix(body: Mapping[str, Any]) -> str | None:
    """Infill's ``suffix`` (the code after the gap; ``None`` or empty: a plain completion)."""
    suffix = body.get("suffix")
    if suffix is None or suffix == "":
        return None
    if not isinstance(suffix, str):
        raise InvalidRequest(f"'suffix' must be a string; got {show(suffix)}.", param="suffix")
    return suffix


def parse_completion(body: Any, info: EngineInfo, *, max_new_tokens: int, max_choices: int) -> OpenAIRequest:
    """``POST infer/v1/completions`` → one ``Request`` per choice; raises ``InvalidRequest``."""
    body = _object(body)
    ignored = ignored_fields(body, COMPLETION_FIELDS)
    model = served_name(body, info)
    stream, include_usage, continuous = _check_stream(body)
    n = _check_n(body, max_choices)
    best_of = body.get("best_of")
    if best_of is not None and (isinstance(best_of, bool) or not isinstance(best_of, int) or best_of > n):
        raise InvalidRequest(
            f"'best_of' ({show(best_of)}) above n is not supported: ask for that many choices (n) and "
            "pick with logprobs.", param="best_of",
        )
    suffix = _suffix(body)
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise InvalidRequest("'echo' must be true or false.", param="echo")
    if echo and suffix is not None:
        raise InvalidRequest("'echo' with a 'suffix' is not supported: the prompt a model reads for an "
                             "infill is not the text you sent.", param="echo")
    logprobs = _logprobs(body, "logprobs")
    prompts = parse_prompts(body.get("prompt"))
    sampling = dict(body)
    if sampling.get("max_tokens") is None:  # the chat route's name, which some clients send here too
        sampling["max_tokens"] = body.get("max_completion_tokens")
    params = parse_sampling(
        sampling, max_new_tokens=max_new_tokens, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        default_temperature=OPENAI_DEFAULT_TEMPERATURE, defaults=info.sampling_defaults,
    )
    params = replace(params, logprobs=logprobs, prompt_logprobs=logprobs if echo else None,
                     constraint=constraint_spec.from_body(body))

    def make(prompt: str | list[int], p: SamplingParams) -> Request:
        if isinstance(prompt, str):
            return _requested(Request(prompt=prompt, params=p, suffix=suffix), body)
        if suffix is not None:
            raise InvalidRequest("A 'suffix' needs the prompt as text, not token ids.", param="suffix")
        return _requested(Request(prompt="", prompt_ids=prompt, params=p), body)

    return OpenAIRequest(_choices(prompts, n, params, make, max_choices), model, stream, include_usage,
                         continuous, n, echo, logprobs, ignored)


# What apply_chat_template itself takes: a template variable of these names would change the
# call, not the template.
_TEMPLATE_RESERVED = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                      "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                      "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}
MAX_TEMPLATE_KWARGS = 32


def parse_template_kwargs(value: Any) -> dict[str, Any] | None:
    """vLLM's ``chat_template_kwargs``: variables for the chat template (Qwen3's
    ``enable_thinking: false``), JSON values under names the template reads."""
    if value is None:
        return None
    param = "chat_template_kwargs"
    if not isinstance(value, dict) or len(value) > MAX_TEMPLATE_KWARGS:
        raise InvalidRequest(f"'{param}' must be an object of at most {MAX_TEMPLATE_KWARGS} template variables, "
                             'e.g. {"enable_thinking": false}.', param=param)
    for name in value:
        if not name.isidentifier() or len(name) > 64 or name in _TEMPLATE_RESERVED:
            raise InvalidRequest(f"'{param}' may not set {show(name)}: give template variables, "
                                 "such as enable_thinking.", param=param)
    return dict(value)


def parse_chat(body: Any, info: EngineInfo, *, max_new_tokens: int, max_choices: int) -> OpenAIRequest:
    """``POST infer/v1/chat/completions`` → one ``Request`` per choice (the service renders
    the chat with the model's chat template)."""
    body = _object(body)
    ignored = ignored_fields(body, CHAT_FIELDS)
    model = served_name(body, info)
    stream, include_usage, continuous = _check_stream(body)
    n = _check_n(body, max_choices)
    chat, wire, constraint = parse_chat_and_tools(body, constraint_spec.from_body(body))
    # The body's tools, read once (parse_chat_and_tools): the set its constraint carries.
    tools = constraint.tools if constraint is not None and constraint.kind == "tools" else None
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise InvalidRequest("'logprobs' must be true or false (top_logprobs says how many).", param="logprobs")
    top = _logprobs(body, "top_logprobs") or 0
    sampling = dict(body)
    if body.get("max_completion_tokens") is not None:
        sampling["max_tokens"] = body["max_completion_tokens"]
    # OpenAI's default is "as much as fits" (None): the service resolves it against the
    # server's limit and the room left in the context.
    params = parse_sampling(
        sampling, max_new_tokens=max_new_tokens, default_max_tokens=None,
        default_temperature=OPENAI_DEFAULT_TEMPERATURE, defaults=info.sampling_defaults,
    )
    params = replace(params, logprobs=top if logprobs else None, constraint=constraint)

    template_kwargs = parse_template_kwargs(body.get("chat_template_kwargs"))

    def make(messages: list[dict[str, str]], p: SamplingParams) -> Request:
        return _requested(Request(prompt="", messages=[dict(m) for m in messages], params=p, wire_messages=wire,
                                  chat_template_kwargs=template_kwargs), body)

    return OpenAIRequest(_choices([chat], n, params, make, max_choices), model, stream, include_usage,
                         continuous, n, False, top if logprobs else None, ignored, tools)


def chat_to_render(body: dict[str, Any]) -> Request:
    """A tokenize body's chat (``messages``, ``tools``, ``chat_template_kwargs``) as the
    request whose prompt the chat route would run."""
    messages, wire_messages, constraint = parse_chat_and_tools(body, None)
    return Request("", SamplingParams(constraint=constraint), messages=messages, wire_messages=wire_messages,
                   chat_template_kwargs=parse_template_kwargs(body.get("chat_template_kwargs")))
