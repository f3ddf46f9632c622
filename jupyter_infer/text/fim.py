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

from collections.abc import Container, Iterable
from dataclasses import dataclass

# Repository-level prompts (other files of the project before the one being edited): the
# families trained with one separate files with this token; the others read them as text.
FILE_SEPARATORS = ("<|file_sep|>", "<file_sep>")

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
    file_separator: str | None = None  # its repository-level separator, if it has one

    def prompt(self, before: str, after: str, files: Iterable[tuple[str, str]] = ()) -> str:
        """The prompt that asks for the code between ``before`` and ``after`` (PSM order),
        after ``files`` (name, text: the project's other files, as llama-server's
        ``input_extra``). CodeLlama's markers are plain pieces of its vocabulary, not added
        tokens: its prompt is text that its tokenizer reads into them, spaced as its paper
        writes it."""
        context = self._context(files)
        if self.family == "codellama":
            return f"{context}<PRE> {before} <SUF>{after} <MID>"
        return f"{context}{self.prefix}{before}{self.suffix}{after}{self.middle}"

    def _context(self, files: Iterable[tuple[str, str]]) -> str:
        """Other files before the prompt: each after the separator and its name where the
        family was trained so (Qwen2.5-Coder's repository format, StarCoder2's), else as
        text with its name in a comment line (llama-server does the same)."""
        sep = self.file_separator
        if sep is None:
            return "".join(f"# {name}\n{text}\n\n" for name, text in files)
        return "".join(f"{sep}{name}\n{text}\n" for name, text in files)


def fim_tokens(vocab: Container[str]) -> FimTokens | None:
    """The fill-in-the-middle tokens of a vocabulary (``None``: the model has none)."""
    for family, (prefix, suffix, middle) in SPELLINGS.items():
        if prefix in vocab and suffix in vocab and middle in vocab:
            separator = next((sep for sep in FILE_SEPARATORS if sep in vocab), None)
            return FimTokens(family, prefix, suffix, middle, separator)
    return None
