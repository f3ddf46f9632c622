"""Tokenizer calls that never freeze the Jupyter server they run in.

A long text is tokenized (or a chat rendered) on a worker thread: that can take long enough
to stall every other handler of the server. Whatever a tokenizer raises on a text becomes a
400: it is the text that it cannot take.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import InferError, InvalidRequest
from ..text.reasoning import opens_reasoning
from ..values.request import Constraint, Request
from ..wire.chat import chat_for_model

if TYPE_CHECKING:
    from ..text.model_text import ModelText

# Texts longer than this are tokenized on a worker thread.
TOKENIZE_INLINE_CHARS = 4096
T = TypeVar("T")
log = logging.getLogger(__name__)


def text_size(messages: list[dict[str, str]]) -> int:
    """The characters of a chat's messages (what its rendering costs, about)."""
    return sum(len(m["content"]) for m in messages)


async def render_prompt(text: ModelText, request: Request, reasons: bool) -> tuple[str, Constraint | None, bool]:
    """A chat request's prompt as the model reads it (its chat template, with the tools where
    the template renders them), the request's constraint with tool calls in the model's
    format, applied after the reasoning section where its answers are split (``reasons``:
    ``EngineInfo.reasoning``), and whether the prompt opened that section (decided here,
    once: the answer's split reads it)."""
    messages, tools, constraint = chat_for_model(request, text.tool_format, text.renders_tools, text.tool_specials)
    render = partial(text.render_chat, template_kwargs=request.chat_template_kwargs, tools=tools)
    size = text_size(messages) + (len(constraint.spec) if tools and constraint else 0)
    prompt = await off_loop(render, messages, size=size)
    opened = reasons and opens_reasoning(prompt[-64:])
    if constraint is not None and reasons:
        constraint = replace(constraint, after_reasoning="open" if opened else "may")
    return prompt, constraint, opened


async def off_loop(fn: Callable[[Any], T], arg: Any, *, size: int) -> T:
    """``fn(arg)`` (the tokenizer, the chat template), on a worker thread when ``size`` is
    large. A tokenizer's failure is a 400 (a Rust tokenizer's panic is even a
    ``BaseException``)."""
    try:
        if size <= TOKENIZE_INLINE_CHARS:
            return fn(arg)
        return await asyncio.to_thread(fn, arg)
    except (InferError, asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:
        log.warning("jupyter_infer: the tokenizer failed on a text", exc_info=err)
        raise InvalidRequest(
            f"The model's tokenizer could not read this text ({type(err).__name__}); "
            "check it for unusual characters.", param="prompt",
        ) from None
