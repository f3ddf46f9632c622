"""The cheap length bound checked before tokenizing: no token stands for more characters than
the longest entry of the vocabulary, so a text longer than ``max_prompt_tokens`` times that
cannot fit, and refusing it by its length refuses nothing that fits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.errors import InvalidRequest
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.text.token_bound import NORMALIZER_MARGIN, longest_token_chars
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request

TEXTS = st.text(st.characters(codec="utf-8"), max_size=300) | st.text("ab \n\tZé😀ﬃ", max_size=300)
PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_no_token_of_the_tiny_model_stands_for_more_than_the_bound(tiny_tokenizer) -> None:
    per_token = longest_token_chars(tiny_tokenizer)
    assert per_token == max(map(len, tiny_tokenizer.get_vocab()))  # byte-level BPE: no normalizer

    @PROPERTY
    @given(TEXTS)
    def holds(text: str) -> None:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert len(text) <= len(ids) * per_token

    holds()


def test_no_token_of_the_simulated_engine_stands_for_more_than_the_bound() -> None:
    engine = SimulatedEngine()

    @PROPERTY
    @given(TEXTS | st.lists(st.sampled_from(["the", " model", " attention", "\r\n", " ", "KV"]),
                            max_size=60).map("".join))
    def holds(text: str) -> None:
        assert len(text) <= len(engine.text.tokenize(text)) * engine.text.max_token_chars

    holds()


def test_a_normalizer_that_may_shorten_text_gets_a_margin(tiny_model_dir: Path) -> None:
    from tokenizers import normalizers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = longest_token_chars(tokenizer)
    tokenizer.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁")])
    assert longest_token_chars(tokenizer) == plain  # only adds
    tokenizer.backend_tokenizer.normalizer = normalizers.NFC()  # "e" + U+0301 -> "é"
    assert longest_token_chars(tokenizer) == plain * NORMALIZER_MARGIN


@pytest.mark.asyncio
async def test_the_service_refuses_by_length_before_tokenizing(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = SimulatedEngine(token_delay_ms=(0, 0), prefill_ms_per_token=0)
    service = InferenceService(ServiceConfig(engine="simulated", max_prompt_tokens=10), engine_loader=lambda: engine)
    service.start()
    tokenized: list[int] = []
    real = engine.text.tokenize
    monkeypatch.setattr(engine.text, "tokenize", lambda text: tokenized.append(len(text)) or real(text))
    bound = 10 * engine.text.max_token_chars
    try:
        with pytest.raises(InvalidRequest, match="InferApp.max_prompt_tokens"):
            await service.submit(Request("x" * (bound + 1)))
        with pytest.raises(InvalidRequest, match="messages"):
            await service.submit(Request("", messages=[{"role": "user", "content": "y" * (bound + 1)}]))
        assert tokenized == []
        # Exactly at the bound, the longest token ten times: it fits, and is served.
        longest = max((p.decode() for p in engine.text.tokenizer.token_bytes() if p.startswith(b" ")), key=len)
        assert len(longest) == engine.text.max_token_chars
        stream = await service.submit(Request(longest * 10))
        assert (await stream.result()).prompt_tokens == 10 and tokenized[0] == bound
        assert service.metrics()["requests"]["rejected"] == 2
    finally:
        await service.stop()
