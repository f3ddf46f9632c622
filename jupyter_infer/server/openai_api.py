"""The OpenAI-compatible shapes: request bodies in, completion objects and chunks out.

Tolerant as vLLM is: a field this server does not act on is ignored (logged once per name,
and named in the ``X-Ignored-Fields`` header of the answer), never a 400. Fields that change
the answer are implemented (sampling extras, ``n``, several prompts, token-id prompts,
``logprobs``, ``echo``); the few it cannot honour (tools, JSON response formats, ``suffix``,
``best_of`` above ``n``) are refused with a 400 that says so, never silently dropped.
Each choice becomes its own ``Request``, so the choices of one call batch together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine import EngineInfo
from ..errors import InferError, InvalidRequest
from ..request import (
    MAX_LOGPROBS,
    SAMPLING_FIELDS,
    Request,
    RequestResult,
    SamplingParams,
    TokenLogprob,
    check_prompt,
    parse_sampling,
    show,
)

log = logging.getLogger(__name__)

OPENAI_DEFAULT_TEMPERATURE = 1.0
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions route
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "user", "function": "user"}
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way

# Fields each route acts on, or accepts knowing they change nothing (user, metadata, ...).
_COMMON = SAMPLING_FIELDS | {"model", "stream", "stream_options", "n", "user", "metadata", "store",
                             "service_tier"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix", "max_completion_tokens"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                         "response_format", "tools", "tool_choice", "parallel_tool_calls",
                         "functions", "function_call"}
_logged_ignored: set[str] = set()  # at most _LOG_IGNORED_MAX names: a client may send any
_LOG_IGNORED_MAX = 100


class UnknownModel(InvalidRequest):
    code = "model_not_found"


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "service_unavailable_error"}


def error_body(err: InferError) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    return error_json(err.status, err.message, err.code, err.param)


def error_json(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- models --------------------------------------------------------------------------------------
def model_names(info: EngineInfo) -> list[str]:
    """The served model's name first, then the aliases a client may use for it."""
    return info.model_names()


def model_card(info: EngineInfo, created: int) -> dict[str, Any]:
    return {"id": info.model, "object": "model", "created": created, "owned_by": "jupyter_infer",
            "root": info.model, "parent": None, "max_model_len": info.max_context}


def models_list(info: EngineInfo, created: int) -> dict[str, Any]:
    """``v1/models``: the served model; behind a router, every backend's (with its route)."""
    if not info.models:
        return {"object": "list", "data": [model_card(info, created)]}
    return {"object": "list", "data": [
        {**model_card(info, created), "id": card["id"], "root": card["id"],
         **({"route": card["route"]} if card.get("route") else {})}
        for card in info.models
    ]}


# -- requests --------------------------------------------------------------------------------------
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


def _check_model(body: Mapping[str, Any], info: EngineInfo) -> str:
    names = model_names(info)
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str) or model not in names:
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


def _refuse_unless(body: Mapping[str, Any], name: str, neutral: tuple[Any, ...], why: str) -> None:
    if name in body and not any(body[name] == v and type(body[name]) is type(v) for v in neutral):
        raise InvalidRequest(f"Unsupported value for '{name}': {show(body[name])} ({why}).", param=name)


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


def parse_completion(body: Any, info: EngineInfo, *, max_new_tokens: int, max_choices: int) -> OpenAIRequest:
    """``POST infer/v1/completions`` → one ``Request`` per choice; raises ``InvalidRequest``."""
    body = _object(body)
    ignored = ignored_fields(body, COMPLETION_FIELDS)
    model = _check_model(body, info)
    stream, include_usage, continuous = _check_stream(body)
    n = _check_n(body, max_choices)
    best_of = body.get("best_of")
    if best_of is not None and (isinstance(best_of, bool) or not isinstance(best_of, int) or best_of > n):
        raise InvalidRequest(
            f"'best_of' ({show(best_of)}) above n is not supported: ask for that many choices (n) and "
            "pick with logprobs.", param="best_of",
        )
    _refuse_unless(body, "suffix", (None, ""), "insertion with a suffix is not supported")
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise InvalidRequest("'echo' must be true or false.", param="echo")
    logprobs = _logprobs(body, "logprobs")
    prompts = parse_prompts(body.get("prompt"))
    sampling = dict(body)
    if sampling.get("max_tokens") is None:  # the chat route's name, which some clients send here too
        sampling["max_tokens"] = body.get("max_completion_tokens")
    params = parse_sampling(
        sampling, max_new_tokens=max_new_tokens, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        default_temperature=OPENAI_DEFAULT_TEMPERATURE,
    )
    params = replace(params, logprobs=logprobs, prompt_logprobs=logprobs if echo else None)

    def make(prompt: str | list[int], p: SamplingParams) -> Request:
        if isinstance(prompt, str):
            return _requested(Request(prompt=prompt, params=p), body)
        return _requested(Request(prompt="", prompt_ids=prompt, params=p), body)

    return OpenAIRequest(_choices(prompts, n, params, make, max_choices), model, stream, include_usage,
                         continuous, n, echo, logprobs, ignored)


def _message_text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    f"messages[{index}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                    "are supported.", param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string.", param="messages")


def parse_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """Chat ``messages`` as ``{role, content}`` text (roles mapped to the template's)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of {role, content}.", param="messages")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object with role and content.", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role is {show(role)}; supported roles: {', '.join(ROLES)}.", param="messages"
            )
        if message.get("tool_calls"):
            raise InvalidRequest("Tool calls are not supported by this server.", param="messages")
        chat.append({"role": ROLES[role], "content": _message_text(message, i)})
    if not any(m["content"].strip() for m in chat):
        raise InvalidRequest("All messages are empty: send some text.", param="messages")
    return chat


def parse_chat(body: Any, info: EngineInfo, *, max_new_tokens: int, max_choices: int) -> OpenAIRequest:
    """``POST infer/v1/chat/completions`` → one ``Request`` per choice (the service renders
    the chat with the model's chat template)."""
    body = _object(body)
    ignored = ignored_fields(body, CHAT_FIELDS)
    model = _check_model(body, info)
    stream, include_usage, continuous = _check_stream(body)
    n = _check_n(body, max_choices)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise InvalidRequest("Only response_format {\"type\": \"text\"} is supported.", param="response_format")
    for name in ("tools", "functions"):
        _refuse_unless(body, name, (None, []), "tool calling is not supported by this server")
    for name in ("tool_choice", "function_call"):
        _refuse_unless(body, name, (None, "none", "auto"), "tool calling is not supported by this server")
    chat = parse_messages(body)
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
        default_temperature=OPENAI_DEFAULT_TEMPERATURE,
    )
    params = replace(params, logprobs=top if logprobs else None)

    def make(messages: list[dict[str, str]], p: SamplingParams) -> Request:
        return _requested(Request(prompt="", messages=[dict(m) for m in messages], params=p), body)

    return OpenAIRequest(_choices([chat], n, params, make, max_choices), model, stream, include_usage,
                         continuous, n, False, top if logprobs else None, ignored)


# -- answers ---------------------------------------------------------------------------------------
def finish_reason(result: RequestResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def _floor(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class Shaper:
    """Builds the answer of one call (completion or chat, whole or chunked, any number of
    choices). ``texts`` names tokens (a token id list → each token's text)."""

    def __init__(self, chat: bool, request_id: str, call: OpenAIRequest,
                 texts: Callable[[list[int]], list[str]] | None = None) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id.removeprefix("req-")
        self.call = call
        self.model = call.model
        self.created = int(time.time())
        self.texts = texts or (lambda ids: [str(t) for t in ids])

    def _base(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + ".chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    # -- usage ----------------------------------------------------------------------------------
    def usage(self, prompt_tokens: list[int], completion_tokens: list[int]) -> dict[str, int]:
        """Totals over the choices; a prompt counts once however many choices it has."""
        prompt = sum(prompt_tokens[:: self.call.n])
        completion = sum(completion_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _usage_of(self, results: list[RequestResult]) -> dict[str, int]:
        return self.usage([r.prompt_tokens for r in results], [r.completion_tokens for r in results])

    # -- whole answers --------------------------------------------------------------------------
    def whole(self, results: list[RequestResult]) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason(result), "logprobs": None}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": result.text}
                if self.call.logprobs is not None:
                    choice["logprobs"] = self.chat_logprobs(result.logprobs or ())
            else:
                echoed = result.prompt_text if self.call.echo else ""
                choice["text"] = echoed + result.text
                if self.call.logprobs is not None:
                    choice["logprobs"] = self.completion_logprobs(result)
            choices.append(choice)
        out = {**self._base(False), "choices": choices, "usage": self._usage_of(results)}
        if results and results[0].route is not None:  # engine = "router": the backend that served
            out["route"] = results[0].route
        return out

    def completion_logprobs(self, result: RequestResult) -> dict[str, Any]:
        """Legacy completions' logprobs: with ``echo`` the prompt's tokens come first (the
        first with ``null``), then the generated ones."""
        entries: list[tuple[int, TokenLogprob | None]] = []
        offset = len(result.prompt_text)
        if self.call.echo:
            offset = 0
            prompt = result.prompt_logprobs or (None,) * len(result.prompt_ids)
            entries += list(zip(result.prompt_ids, prompt, strict=True))
        entries += list(zip(result.token_ids, result.logprobs or (), strict=False))
        return self._completion_entries(entries, offset)

    def _completion_entries(self, entries: list[tuple[int, TokenLogprob | None]], offset: int) -> dict[str, Any]:
        ids = [t for t, _ in entries]
        for _, record in entries:
            if record is not None:
                ids += [t for t, _ in record.top]
        names = dict(zip(ids, self.texts(ids), strict=True))
        tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
        for token, record in entries:
            tokens.append(names[token])
            text_offset.append(offset)
            offset += len(names[token])
            if record is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(_floor(record.logprob))
            # vLLM's shape: the k most likely, and the chosen token too.
            top = {names[t]: _floor(lp) for t, lp in record.top}
            top.setdefault(names[token], _floor(record.logprob))
            top_logprobs.append(top)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": text_offset}

    def chat_logprobs(self, records: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
        ids = [r.token_id for r in records] + [t for r in records for t, _ in r.top]
        names = dict(zip(ids, self.texts(ids), strict=True))

        def entry(token: int, logprob: float) -> dict[str, Any]:
            name = names[token]
            return {"token": name, "logprob": _floor(logprob), "bytes": list(name.encode("utf-8"))}

        return {"content": [
            {**entry(r.token_id, r.logprob), "top_logprobs": [entry(t, lp) for t, lp in r.top]}
            for r in records
        ], "refusal": None}

    # -- chunks ---------------------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, *, finish_reason: str | None = None, first: bool = False,
              logprobs: dict[str, Any] | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason, "logprobs": logprobs}
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = {**self._base(True), "choices": [choice]}
        if self.call.include_usage or self.call.continuous_usage:
            out["usage"] = usage
        return out

    def event_logprobs(self, records: tuple[TokenLogprob, ...], offset: int = 0) -> dict[str, Any] | None:
        """The logprobs of one chunk's tokens, in the route's shape (None if not asked);
        ``offset``: the choice's text sent before this chunk."""
        if self.call.logprobs is None:
            return None
        if self.chat:
            return self.chat_logprobs(records)
        return self._completion_entries([(r.token_id, r) for r in records], offset)

    def echo_logprobs(self, prompt_ids: list[int], records: tuple[TokenLogprob | None, ...] | None) -> dict[str, Any] | None:
        if self.call.logprobs is None:
            return None
        records = records or (None,) * len(prompt_ids)
        return self._completion_entries(list(zip(prompt_ids, records, strict=True)), 0)

    def usage_chunk(self, results: list[RequestResult]) -> dict[str, Any]:
        return {**self._base(True), "choices": [], "usage": self._usage_of(results)}
