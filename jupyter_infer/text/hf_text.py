"""A Hugging Face checkpoint's text side: its tokenizer (from the folder, the Hub cache or a
GGUF file), its chat template, tool format, reasoning markers, end of sequence and
fill-in-the-middle tokens, read once at load (``HFText``)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from ..constraints import tool_formats
from ..errors import InvalidRequest
from ..formats import gguf_load
from .fim import fim_tokens
from .model_text import ModelText
from .reasoning import reasons
from .token_bound import longest_token_chars


def load_tokenizer(model: str, local_files_only: bool) -> Any:
    """The checkpoint's tokenizer: a folder's or a Hub id's (transformers'), or the one a GGUF
    file carries."""
    if gguf_load.is_gguf(model):
        return gguf_load.load_tokenizer(model)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=local_files_only)


class HFText(ModelText):
    """Text in and out through a transformers tokenizer and its chat template.

    ``generation_config`` is the model's (its EOS ids: Llama 3's end of turn besides EOS, a
    GGUF file's own); ``tool_call_format`` overrides the format read from the template;
    ``split_reasoning`` off keeps a reasoning model's section in its content."""

    def __init__(self, tokenizer: Any, generation_config: Any = None, *, tool_call_format: str = "",
                 split_reasoning: bool = True, special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        # Whether a text's ids get the tokenizer's own markers (an encoder's [CLS] and [SEP]).
        self.special_tokens = special_tokens
        eos = getattr(generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.max_token_chars = longest_token_chars(tokenizer)
        self.tool_format, self.renders_tools, self.tool_specials = tool_formats.of_tokenizer(tokenizer, tool_call_format)
        self.reasons = split_reasoning and reasons(tokenizer)
        self.fim = fim_tokens(tokenizer.get_vocab())

    @property
    def has_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.special_tokens)

    def tokenize_pair(self, first: str, second: str) -> list[int]:
        return self.tokenizer(first, second, add_special_tokens=True)["input_ids"]

    def detokenize(self, token_ids: Seq[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        if not self.has_template:
            return super().render_chat(messages, template_kwargs, tools)
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      tools=tools, **(template_kwargs or {}))
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError, RecursionError) as err:
            # "Conversation roles must alternate user/assistant", a template's own
            # raise_exception, one that reads a field these messages lack, or tools nested
            # too deep for its ``tojson``.
            raise InvalidRequest(f"The model's chat template refused these messages: {err}",
                                 param="messages") from None
