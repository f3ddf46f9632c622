"""A model's text side, apart from its engine: the tokenizer, template, EOS and
fill-in-the-middle tokens read once at load (``text/hf_text.py``, ``text/fim.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, GenerationConfig

from jupyter_infer.text.fim import SPELLINGS, fim_tokens
from jupyter_infer.text.hf_text import HFText, load_tokenizer
from jupyter_infer.text.model_text import ModelText


def test_a_checkpoint_s_text_side_reads_its_tokenizer_and_generation_config(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir), local_files_only=True)
    # The generation config's EOS ids win over the tokenizer's (Llama 3's end of turn besides EOS).
    text = HFText(tokenizer, GenerationConfig(eos_token_id=[3, 5]))
    assert text.eos_token_ids == {3, 5}
    assert HFText(tokenizer).eos_token_ids == {tokenizer.eos_token_id}
    ids = text.tokenize("Hello there, world")
    assert text.detokenize(ids) == "Hello there, world"
    assert "".join(text.token_texts(ids)) == "Hello there, world"
    assert text.max_token_chars and text.fim is None and not text.reasons


def test_without_a_template_a_chat_is_its_lines() -> None:
    assert ModelText().render_chat([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"


@pytest.mark.parametrize("family", sorted(SPELLINGS))
def test_each_family_s_fim_tokens_are_found_in_its_vocabulary(family: str) -> None:
    prefix, suffix, middle = SPELLINGS[family]
    found = fim_tokens({"a": 0, prefix: 1, suffix: 2, middle: 3})
    assert found is not None and found.family == family
    prompt = found.prompt("def f(x):\n    ", "\n    return y")
    if family == "codellama":  # plain vocabulary pieces: text its tokenizer reads into them
        assert prompt == "<PRE> def f(x):\n     <SUF>\n    return y <MID>"
    else:
        assert prompt == f"{prefix}def f(x):\n    {suffix}\n    return y{middle}"
    assert fim_tokens({"a": 0, prefix: 1, suffix: 2}) is None  # all three, or none


def test_a_tokenizer_with_fim_tokens_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPELLINGS["qwen"])})
    text = HFText(tokenizer)
    assert text.fim is not None and text.fim.family == "qwen"
    # Added special tokens: the prompt's markers are one token each.
    ids = text.tokenize(text.fim.prompt("a = ", "\nb = a"))
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|fim_middle|>")


def test_a_reason_is_cut_at_a_word_s_end_never_inside_one() -> None:
    from jupyter_infer.values.request import brief

    said = "small is not in the Hugging Face cache: hf download small, or make a small test model. " * 12
    cut = brief(said + "\nTraceback ...", limit=300)
    assert cut.endswith("…") and len(cut) <= 301
    assert said.startswith(cut[:-1]) and not said[len(cut) - 1].isalnum()  # the word it ends on is whole
    assert brief("short\nsecond line") == "short"
