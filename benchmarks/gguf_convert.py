"""llama.cpp's HF → GGUF converter (``convert_hf_to_gguf.py``), run on our locally built models.

    python -m benchmarks.gguf_convert CONVERTER MODEL_DIR [the converter's options]

imports the converter from where it lies (its ``gguf-py`` beside it), fills two gaps that
a locally built model leaves, and runs the converter's own ``main()`` with the options:

- its tokenizer was trained here, so the converter has no hash for its pre-tokenizer and
  refuses it; it is a byte-level BPE whose pre-tokenizer is GPT-2's, so an unknown one is
  taken as ``gpt-2``;
- transformers 5 writes GPT-2 configs without ``n_ctx``, which the converter's GPT-2 reads;
  ``n_positions`` is the same number.

Both are adjustments of the converter's base classes (``ModelBase.load_hparams`` and
``TextModel.get_vocab_base_pre``; in ``conversion/base.py`` in newer llama.cpp, in the script
itself in older ones), which every model class it picks inherits. Run it in a process of
its own (``cpu.gguf_path`` does): the converter reads ``sys.argv``, sets up logging and
loads the whole model.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

GPT2_PRE_TOKENIZER = "gpt-2"


def load_converter(path: Path) -> ModuleType:
    """Import ``convert_hf_to_gguf.py`` from ``path``, with its own ``gguf-py`` (and, in newer
    llama.cpp, its ``conversion`` package) found beside it."""
    path = path.resolve()
    sys.path[:0] = [str(path.parent), str(path.parent / "gguf-py")]
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["convert_hf_to_gguf"] = module  # what its own modules import it as
    spec.loader.exec_module(module)
    return module


def base_classes(converter: ModuleType) -> tuple[type, type]:
    """The converter's ``ModelBase`` and ``TextModel``, wherever its version keeps them."""
    home: Any = converter if hasattr(converter, "TextModel") else importlib.import_module("conversion.base")
    return home.ModelBase, home.TextModel


def fill_gaps(model_base: type, text_model: type) -> None:
    """Teach the converter our models: ``n_ctx`` from ``n_positions``, an unknown BPE
    pre-tokenizer as GPT-2's."""
    load_hparams = model_base.load_hparams  # a staticmethod: the plain function

    def with_n_ctx(*args: Any, **kwargs: Any) -> dict[str, Any]:
        hparams = load_hparams(*args, **kwargs)
        if "n_positions" in hparams:
            hparams.setdefault("n_ctx", hparams["n_positions"])
        return hparams

    get_vocab_base_pre = text_model.get_vocab_base_pre

    def gpt2_if_unknown(self: Any, tokenizer: Any) -> str:
        try:
            return get_vocab_base_pre(self, tokenizer)
        except NotImplementedError:  # its way of saying "no hash for this pre-tokenizer"
            return GPT2_PRE_TOKENIZER

    model_base.load_hparams = staticmethod(with_n_ctx)
    text_model.get_vocab_base_pre = gpt2_if_unknown


def main(argv: list[str] | None = None) -> None:
    """``CONVERTER MODEL_DIR OPTIONS...``: convert the model with the gaps filled."""
    converter_path, *options = sys.argv[1:] if argv is None else argv
    sys.argv = [str(Path(converter_path).resolve()), *options]  # the converter parses these
    converter = load_converter(Path(converter_path))
    fill_gaps(*base_classes(converter))
    converter.main()


if __name__ == "__main__":
    main()
