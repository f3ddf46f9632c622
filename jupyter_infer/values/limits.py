"""What a request may ask for (``Limits``), and the checks that hold every request to it.

Both loops' ``prepare`` run these, local or upstream, so a request is refused with the same
message whatever serves it, before anything is queued. The checks that cost no tokenizing
(``screen``) run before the tokenizer does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..errors import ContextLengthExceeded, InvalidRequest, UnknownModel
from .request import check_text

if TYPE_CHECKING:
    from .config import ServiceConfig
    from .engine_info import EngineInfo
    from .request import Request


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, and how batches are formed (``status()['limits']``)."""

    mode: str
    batch_window_ms: float
    max_batch_size: int
    max_queue_size: int
    max_new_tokens: int
    max_prompt_tokens: int
    max_prefill_tokens: int

    @classmethod
    def from_config(cls, cfg: ServiceConfig) -> Limits:
        return cls(
            mode=cfg.mode, batch_window_ms=cfg.batch_window_ms, max_batch_size=cfg.batch_size,
            max_queue_size=cfg.max_queue_size, max_new_tokens=cfg.max_new_tokens,
            max_prompt_tokens=cfg.max_prompt_tokens, max_prefill_tokens=cfg.max_prefill_tokens,
        )

    def max_prompt_chars(self, max_token_chars: int | None, max_context: int) -> int | None:
        """The longest text that could fit in ``max_prompt_tokens`` (None if unknown)."""
        if max_token_chars is None:
            return None
        return min(self.max_prompt_tokens, max_context) * max_token_chars

    def screen(self, request: Request, max_token_chars: int | None, max_context: int) -> None:
        """The checks that cost no tokenizing, run before it: the text is valid Unicode, and
        it is not longer than the longest prompt that could fit.

        No token stands for more than ``max_token_chars`` characters, so a text of more than
        ``max_prompt_tokens * max_token_chars`` characters cannot tokenize into
        ``max_prompt_tokens`` tokens; refusing it by its length refuses nothing that fits.
        For a chat, the messages' text counts (the template only adds to it).
        """
        if request.prompt_ids is not None:
            return
        chat = request.messages is not None
        texts = [m["content"] for m in request.messages] if chat else [request.prompt]
        for text in texts:
            check_text(text, "messages" if chat else "prompt")
        bound = self.max_prompt_chars(max_token_chars, max_context)
        chars = sum(map(len, texts))
        if bound is not None and chars > bound:
            max_tokens = min(self.max_prompt_tokens, max_context)
            # Past the model's context (not only this server's limit): what clients act on.
            error = ContextLengthExceeded if max_context <= self.max_prompt_tokens else InvalidRequest
            raise error(
                f"{'The messages have' if chat else 'The prompt has'} {chars:,} characters: more than "
                f"can fit in this server's limit of {max_tokens:,} tokens (InferApp.max_prompt_tokens, "
                f"and the model's context), as no token of this model stands for more than "
                f"{max_token_chars} characters. Shorten it.", param="messages" if chat else "prompt",
            )

    def check(self, request: Request, prompt_tokens: int, max_context: int, *, estimated: bool = False) -> Request:
        """Every limit a request must meet; returns it with an open ``max_tokens`` resolved
        to as many as fit. ``estimated``: the prompt's size is a guess (an upstream tokenizes)."""
        params = request.params
        room = max_context - prompt_tokens
        if params.max_tokens is None:
            params = replace(params, max_tokens=max(1, min(self.max_new_tokens or room, room)))
            request = replace(request, params=params)
        max_tokens = params.max_tokens
        if self.max_new_tokens and max_tokens > self.max_new_tokens:
            raise InvalidRequest(
                f"'max_tokens' is {max_tokens}, above this server's limit of "
                f"{self.max_new_tokens} (InferApp.max_new_tokens). Ask for fewer tokens.",
                param="max_tokens",
            )
        if not prompt_tokens:
            raise InvalidRequest("The prompt is empty after tokenization: send some text.", param="prompt")
        if params.min_tokens > max_tokens:
            raise InvalidRequest(
                f"'min_tokens' ({params.min_tokens}) is above 'max_tokens' ({max_tokens}).",
                param="min_tokens",
            )
        about = "about " if estimated else ""
        if room <= 0:  # no answer fits, whatever max_tokens or this server's limits say
            chat = request.messages is not None
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_context} tokens, and the "
                f"{'messages take' if chat else 'prompt takes'} {about}{prompt_tokens} of them, leaving no room "
                "for an answer. Shorten it.", param="messages" if chat else "prompt",
            )
        if prompt_tokens > self.max_prompt_tokens:
            raise InvalidRequest(
                f"The prompt has {about}{prompt_tokens} tokens, above this server's limit of "
                f"{self.max_prompt_tokens} (InferApp.max_prompt_tokens). Shorten it.", param="prompt",
            )
        if max_tokens > room:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
                f"answer); ask for at most {room} tokens or shorten the prompt.", param="max_tokens",
            )
        if params.constraint is not None and (params.ignore_eos or params.min_tokens):
            # The grammar decides where a constrained answer ends (EOS is all it allows once
            # complete), so neither may hold it open.
            request = replace(request, params=replace(params, ignore_eos=False, min_tokens=0))
        return request


def check_model(request: Request, info: EngineInfo) -> None:
    """The model the caller named is the one served here (or one of its names)."""
    if request.model is not None and request.model not in info.model_names():
        raise UnknownModel(
            f"The model {request.model!r} is not served here; use {info.model!r} "
            "(see GET infer/v1/models).", param="model",
        )


def check_token_ids(token_ids: list[int], vocab_size: int, name: str) -> None:
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"'{name}' holds the token id {bad}, outside this model's vocabulary "
            f"(0 to {vocab_size - 1}).", param=name,
        )
