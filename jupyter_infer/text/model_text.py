"""What a model reads and writes as text, apart from the engine that runs it: its tokenizer,
its chat template, how it writes tool calls, whether it reasons, its end of sequence, its
fill-in-the-middle tokens.

The engine runs token ids; the loops and the routes turn text into ids and back through this
(``Engine.text``), so a dialect, a template or a tool format never reaches the runner.
``ModelText`` is also the plain text side a model without a template has (the simulated
engine's): a chat is its messages as ``role: content`` lines.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from ..constraints.tool_formats import HERMES, ToolFormat
from ..errors import InvalidRequest
from .fim import FimTokens


class ModelText:
    """Text in and out for one model. Subclasses tokenize (``tokenize``, ``detokenize``) and
    may render a chat template. ``tokenize``/``detokenize`` may run on any thread."""

    # The model's end of sequence (a bench or a test may empty it while the engine serves:
    # the answer stage and the samplers read it at each token).
    eos_token_ids: frozenset[int] = frozenset()
    # The most characters of input text that one token can stand for (the longest token of
    # the vocabulary), or None if no such bound is known. A text longer than
    # ``max_prompt_tokens * max_token_chars`` cannot fit: the service refuses it before
    # spending any time tokenizing it.
    max_token_chars: int | None = None
    # How this model writes tool calls, whether its chat template renders a request's tools
    # itself (``render_chat``'s ``tools``), and the format's marker as its special token.
    tool_format: ToolFormat = HERMES
    renders_tools = False
    tool_specials: dict[str, int] = {}  # noqa: RUF012 - never mutated; subclasses assign their own
    # Whether its answers open with a reasoning section to split out (text/reasoning.py).
    reasons = False
    # Its fill-in-the-middle tokens (text/fim.py), None: it has none.
    fim: FimTokens | None = None

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def detokenize(self, token_ids: Seq[int]) -> str:
        raise NotImplementedError

    def token_texts(self, token_ids: Seq[int]) -> list[str]:
        """Each token's own text (logprobs name tokens by it)."""
        return [self.detokenize([t]) for t in token_ids]

    def infill_prompt(self, before: str, after: str, files: Seq[tuple[str, str]] = (), *,
                      model: str = "This model") -> str:
        """The prompt asking for the code between ``before`` and ``after`` (``suffix``, infill),
        written with the model's own fill-in-the-middle tokens; a 400 where it has none."""
        if self.fim is None:
            raise InvalidRequest(
                f"{model} has no fill-in-the-middle tokens, so it cannot fill in code between a prefix "
                "and a suffix: serve a code model trained for it (Qwen2.5-Coder, StarCoder2, CodeLlama, "
                "DeepSeek-Coder), or leave 'suffix' out.", param="suffix")
        return self.fim.prompt(before, after, files)

    def tokenize_pair(self, first: str, second: str) -> list[int]:
        """Two texts as one sequence, as a cross-encoder reads them ([CLS] a [SEP] b [SEP])."""
        raise InvalidRequest("Only a cross-encoder (a reranker) reads pairs of texts.", param="documents")

    def render_chat(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """A chat as one prompt; a model with a chat template overrides this (and reads
        ``template_kwargs``, and ``tools`` where ``renders_tools``)."""
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + "\nassistant:"
