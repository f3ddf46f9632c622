"""The simulated engine's tokenizer: exact round trips, realistic counts, no growth from prompts."""

from __future__ import annotations

import gc
import random
import re
import string
import sys

import pytest

from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.engine.simulated.answers import compose_answer
from jupyter_infer.engine.simulated.knowledge_tokenizer import EOS_ID, knowledge_tokenizer
from jupyter_infer.values.prompts import SAMPLE_PROMPTS

_LETTERS = bytes((string.ascii_lowercase + " ")[b % 27].encode()[0] for b in range(256))


def made_up_words(seed: int, size: int = 1 << 20) -> str:
    """``size`` characters of made-up lowercase words: almost every one new to any vocabulary."""
    return random.Random(seed).randbytes(size).translate(_LETTERS).decode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "a  b\n\n\tc \r\nd ",
        "Attention, batching and the KV cache; don't 'quote' me!",
        "注意力 🤖 émigré naïve Straße",
        "lone surrogates \ud800 and \udfff survive",
        "tabs\tand\x00nulls\x7f",
        made_up_words(1),
    ],
    ids=["empty", "spaces", "whitespace", "prose", "unicode", "surrogates", "controls", "1 MiB made up"],
)
def test_detokenize_gives_back_any_text(text: str) -> None:
    engine = SimulatedEngine()
    assert engine.text.detokenize(engine.text.tokenize(text)) == text


def test_answers_cost_one_token_per_word_mark_or_paragraph_break() -> None:
    engine = SimulatedEngine()
    for prompt in [*SAMPLE_PROMPTS, "banana bread"]:
        for seed in range(5):
            answer = compose_answer(prompt, seed)
            ids = engine.text.tokenize(answer)
            assert len(ids) == len(re.findall(r"[\w']+|[^\w\s]|\n+", answer))
            assert engine.text.detokenize(ids) == answer


def test_unknown_words_cost_about_what_a_bpe_spends_on_them() -> None:
    engine = SimulatedEngine()
    text = made_up_words(2, 10_000)
    words = len(text.split())
    # A seen word is one token; a never-seen one a few (one per two letters here).
    assert words < len(engine.text.tokenize(text)) < len(text) * 0.6
    assert len(engine.text.tokenize("What is dynamic batching?")) == 5


def test_a_character_spelled_in_bytes_streams_only_when_complete() -> None:
    engine = SimulatedEngine()
    ids = engine.text.tokenize("🤖")
    assert len(ids) == 4  # the robot is not in the vocabulary: four UTF-8 bytes
    assert engine.text.detokenize(ids[:2]).endswith("\ufffd")  # what Sequence.append holds back
    assert engine.text.detokenize([*ids, EOS_ID]) == "🤖"


def test_a_crlf_is_never_split_between_tokens() -> None:
    engine = SimulatedEngine()
    fragments = [engine.text.detokenize([i]) for i in engine.text.tokenize("one \r\ntwo\r\n\r\nthree zzz\r\n")]
    # A stream reader (SSE) would take a CR and an LF in separate events for two line breaks.
    assert not any(fragment.endswith("\r") for fragment in fragments), fragments


def test_detokenize_refuses_ids_outside_the_vocabulary() -> None:
    engine = SimulatedEngine()
    with pytest.raises(ValueError, match="not in the vocabulary"):
        engine.text.detokenize([knowledge_tokenizer().vocab_size])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        engine.text.detokenize([-1])


def test_prompts_of_made_up_words_leave_no_memory_behind() -> None:
    """Issue 9: 20 refused 1 MiB prompts of made-up words grew the old vocabulary by ~100 MB."""
    engine = SimulatedEngine()
    vocab_size = knowledge_tokenizer().vocab_size
    engine.text.tokenize(made_up_words(100))  # warm up whatever is cached once
    gc.collect()
    blocks = sys.getallocatedblocks()
    for seed in range(20):
        engine.text.tokenize(made_up_words(seed))
    gc.collect()
    # The old tokenizer kept two objects per new word: about a million blocks here.
    assert sys.getallocatedblocks() - blocks < 10_000
    assert knowledge_tokenizer().vocab_size == vocab_size
