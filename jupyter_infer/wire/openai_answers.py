"""OpenAI answers out: completion objects, stream chunks, model cards and errors in OpenAI's
shapes; the request bodies they answer are parsed in ``openai_requests``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import InferError
from ..values.answer import AnswerPiece
from ..values.engine_info import EngineInfo
from ..values.request import RequestResult, TokenLogprob, token_usage
from .openai_requests import OpenAIRequest

LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
                413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable_error"}


def error_body(err: InferError) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    return error_json(err.status, err.message, err.code, err.param)


def error_json(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- models --------------------------------------------------------------------------------------
def model_card(info: EngineInfo, created: int) -> dict[str, Any]:
    return {"id": info.served_name, "object": "model", "created": created, "owned_by": "jupyter_infer",
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


# -- answers ---------------------------------------------------------------------------------------
def finish_reason(result: RequestResult, legacy: bool = False) -> str:
    """OpenAI's: ``length``, ``tool_calls`` (the answer is calls, not to a named tool, as the
    answer stage read it; ``function_call`` for a legacy ``functions`` request), ``stop``."""
    if result.finish_reason == "length":
        return "length"
    if result.finish_reason == "tool_calls":
        return "function_call" if legacy else "tool_calls"
    return "stop"


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_calls`` entry as the legacy ``function_call`` (no id, no type)."""
    return {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}


def _floor(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class Shaper:
    """Builds the answer of one call (completion or chat, whole or chunked, any number of
    choices) from the answers as the answer stage read them. ``texts`` names tokens (a token
    id list → each token's text)."""

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
        return token_usage(prompt, completion)

    def _usage_of(self, results: list[RequestResult]) -> dict[str, int]:
        return self.usage([r.prompt_tokens for r in results], [r.completion_tokens for r in results])

    # -- whole answers --------------------------------------------------------------------------
    def whole(self, results: list[RequestResult]) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            legacy = self.call.tools is not None and self.call.tools.legacy
            choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason(result, legacy),
                                      "logprobs": None}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": result.content}
                if result.reasoning is not None:
                    choice["message"]["reasoning_content"] = result.reasoning
                if self.call.tools is not None and result.tool_calls is not None:
                    # The answer is calls (cut short by max_tokens: the calls so far, the last
                    # one's arguments as far as they got, and "length", as the stream sends them).
                    calls = list(result.tool_calls)
                    said = ({"function_call": _function_call(calls[0]) if calls else None} if legacy
                            else {"tool_calls": calls or None})
                    choice["message"] = {**choice["message"], "content": None, **said}
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

    def piece_chunks(self, index: int, pieces: tuple[AnswerPiece, ...], usage: dict[str, int] | None = None,
                     logprobs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Stream chunks for pieces of an answer: reasoning as ``reasoning_content``, text as
        ``content``; a call's first piece with its ``index``, ``id``, ``type`` and ``name``,
        then ``arguments`` pieces. ``logprobs`` (the tokens' since the last chunk) ride on the
        first chunk, or an empty one."""
        chunks = []
        for piece in pieces:
            if piece.kind == "reasoning":
                chunk = self.chunk(index, None, usage=usage)
                chunk["choices"][0]["delta"]["reasoning_content"] = piece.text
            elif piece.kind == "content":
                chunk = self.chunk(index, piece.text, usage=usage)
            else:
                chunk = self._call_chunk(index, piece, usage)
            chunks.append(chunk)
        if logprobs is not None:
            if not chunks:  # the text is held back (it may open a call), the logprobs are not
                chunks.append(self.chunk(index, None if self.chat else "", usage=usage))
            chunks[0]["choices"][0]["logprobs"] = logprobs
        return chunks

    def _call_chunk(self, index: int, piece: AnswerPiece, usage: dict[str, int] | None) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": piece.index, "function": {"arguments": piece.text}}
        if piece.opens_call:
            entry = {"index": piece.index, "id": piece.call_id, "type": "function",
                     "function": {"name": piece.name, "arguments": piece.text}}
        chunk = self.chunk(index, None, usage=usage)
        if self.call.tools is not None and self.call.tools.legacy:  # one call: no index, no id
            chunk["choices"][0]["delta"]["function_call"] = entry["function"]
        else:
            chunk["choices"][0]["delta"]["tool_calls"] = [entry]
        return chunk

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
