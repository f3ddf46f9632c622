"""A code model's fill-in-the-middle tokens, read from its own vocabulary: the prompt that
asks it for the code between a prefix and a suffix (``suffix`` on completions, llama-server's
``infill``, Ollama's ``generate``).

The spellings differ by family; each is the three tokens of prefix, suffix and middle, and
the prompt is written prefix-suffix-middle (PSM), as the families were trained:

- Qwen2.5-Coder, Qwen3-Coder: ``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>``
- StarCoder, StarCoder2, SantaCoder: ``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``
- CodeLlama: ``▁<PRE>``, ``▁<SUF>``, ``▁<MID>``
- DeepSeek-Coder: ``<｜fim▁begin｜>``, ``<｜fim▁hole｜>``, ``<｜fim▁end｜>``
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

SPELLINGS: dict[str, tuple[str, str, str]] = {
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "codellama": ("▁<PRE>", "▁<SUF>", "▁<MID>"),
    "deepseek": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
}


@dataclass(frozen=True)
class FimTokens:
    """One family's fill-in-the-middle tokens, as its vocabulary spells them."""

    family: str
    prefix: str
    suffix: str
    middle: str

    def prompt(self, before: str, after: str) -> str:
        """The prompt that asks for the code between ``before`` and ``after`` (PSM order).
        CodeLlama's are plain pieces of its vocabulary, not added tokens: its prompt is text
        that its tokenizer reads into them, spaced as its paper writes it."""
        if self.family == "codellama":
            return f"<PRE> {before} <SUF>{after} <MID>"
        return f"{self.prefix}{before}{self.suffix}{after}{self.middle}"


def fim_tokens(vocab: Container[str]) -> FimTokens | None:
    """The fill-in-the-middle tokens of a vocabulary (``None``: the model has none)."""
    for family, (prefix, suffix, middle) in SPELLINGS.items():
        if prefix in vocab and suffix in vocab and middle in vocab:
            return FimTokens(family, prefix, suffix, middle)
    return None
