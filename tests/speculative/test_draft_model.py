"""Speculative decoding with a draft model: a smaller model with the same tokenizer guesses,
the model verifies; answers identical to decoding without guesses, token for token."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from engine_steps import keeping
from test_hf_engine import _seq, reference
from test_speculative import COPY, _answers
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.commands.model_builder import make_model
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.speculative.draft_model import DraftKV
from jupyter_infer.values.config import ServiceConfig

# Prompts that do not quote themselves: prompt lookup finds little here, a draft model guesses anyway.
FRESH = ["Explain how a tokenizer splits words", "Batching helps because", "The scheduler picks"]


def _perturbed(model_dir: Path, into: Path, scale: float) -> Path:
    """A copy of the model with noise on its weights: it agrees with the model on most tokens,
    not all (so some guesses are kept and some refused)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(3)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp(min=1e-3))
    model.save_pretrained(into)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(into)
    return into


@pytest.fixture(scope="module", params=["tiny_model_dir", "llama_model_dir"])
def target_and_draft(request, tmp_path_factory) -> tuple[Path, Path]:
    target = request.getfixturevalue(request.param)
    return target, _perturbed(target, tmp_path_factory.mktemp("draft"), 0.3)


@pytest.mark.asyncio
async def test_a_draft_models_guesses_keep_answers_equal_to_generate(target_and_draft) -> None:
    target, draft = target_and_draft
    engine = HFEngine(str(target), dtype="float32", num_threads=1, draft_model=str(draft))
    prompts, lengths = [*FRESH, COPY[0]], [30, 25, 33, 28]
    results, spec = await _answers(engine, prompts, lengths, late=True, draft_model=str(draft))
    assert engine.speculative_method == "draft"
    # It guessed on prompts that quote nothing, kept some guesses and refused others.
    assert spec["accepted_tokens"] > 0 and spec["acceptance_rate"] < 1.0
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert list(result.token_ids) == reference(target, prompt, n), prompt


@pytest.mark.asyncio
async def test_the_model_as_its_own_draft_has_every_guess_kept(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, draft_model=str(tiny_model_dir))
    [result], spec = await _answers(engine, FRESH[:1], [40], draft_model=str(tiny_model_dir))
    assert list(result.token_ids) == reference(tiny_model_dir, FRESH[0], 40)
    assert spec["acceptance_rate"] > 0.95 and spec["tokens_per_row_step"] > 3


def test_the_draft_models_kv_follows_what_its_rows_kept_and_goes_when_they_leave(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    draft = _perturbed(tiny_model_dir, tmp_path / "draft", 0.3)
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, draft_model=str(draft))
    engine.text.eos_token_ids = frozenset()
    engine.configure_speculation("draft", 4, 8)
    seqs = [_seq(engine, p, 30) for p in FRESH[:2]]
    sampled = engine.execute(keeping(engine, 0, seqs))
    guessed = 0
    for _ in range(8):
        for seq, output in zip(seqs, sampled, strict=True):
            seq.output_ids += output.tokens
        sampled = engine.execute(keeping(engine, 0, seqs, [s.id for s in seqs], guesses=[4, 4]))
        for seq, proposed in zip(seqs, [o.proposed for o in sampled], strict=True):
            row = _draft_kv(engine, seq.id)
            assert row.cache.get_seq_length() == len(row.fed)
            if proposed:  # its cache holds the row's history and the guesses it fed after it
                guessed += 1
                history = [*seq.prompt_ids, *seq.output_ids]
                assert row.fed[: len(history)] == history and len(row.fed) == len(history) + proposed - 1
    assert guessed
    del row  # the test's own reference
    departed = weakref.ref(_draft_kv(engine, seqs[1].id))
    engine.execute(keeping(engine, 0, seqs[:1], [seqs[0].id]))
    gc.collect()
    assert departed() is None and _draft_kv(engine, seqs[0].id) is not None  # the row that left freed its draft KV


def _draft_kv(engine: HFEngine, row_id: str) -> DraftKV | None:
    """The draft model's KV that the running row ``row_id`` holds."""
    return next(r.draft for bucket in engine.decoding_buckets() for r in bucket.rows if r.id == row_id)


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_model_dir: Path, models_dir: Path) -> None:
    other = make_model(models_dir / "tiny-other-vocab", "tiny", vocab_size=1000)
    with pytest.raises(ValueError, match="InferApp.draft_model .* another tokenizer"):
        HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, draft_model=str(other))


def test_speculative_auto_is_draft_with_a_draft_model_and_draft_needs_one() -> None:
    assert ServiceConfig().speculation == "ngram"
    assert ServiceConfig(draft_model="some/model").speculation == "draft"
    assert ServiceConfig(draft_model="some/model", speculative="ngram").speculation == "ngram"
    assert ServiceConfig(draft_model="some/model", speculative="off").speculation == "off"
    with pytest.raises(ValueError, match="needs InferApp.draft_model"):
        ServiceConfig(speculative="draft")


@pytest.fixture
def jp_server_config(tiny_model_dir: Path) -> dict:
    from server_helpers import server_config

    return server_config(engine="hf", model=str(tiny_model_dir), dtype="float32", num_threads=1,
                         prefix_cache_mb=0, draft_model=str(tiny_model_dir))


async def test_the_server_says_which_draft_model_guesses(jp_fetch, tiny_model_dir: Path) -> None:
    import json

    body = json.dumps({"prompt": FRESH[1], "max_tokens": 30, "ignore_eos": True})
    answer = json.loads((await jp_fetch("infer", "generate", method="POST", body=body)).body)
    assert answer["usage"]["completion_tokens"] == 30
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["speculative"] == {"method": "draft", "max_tokens": 16, "max_rows": 8,
                                     "draft_model": str(tiny_model_dir)}
    spec = json.loads((await jp_fetch("infer", "metrics")).body)["speculative"]
    assert spec["acceptance_rate"] > 0.9 and spec["tokens_per_row_step"] > 2


def test_a_draft_model_that_cannot_be_loaded_says_so_and_how_to_do_without(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    from jupyter_infer.engine import load_engine

    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=r"InferApp.draft_model .*no-such-model.* could not be loaded.*speculative = 'ngram'"):
        HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, draft_model=missing,
                 draft_local_files_only=True)
    # engine "auto" with a model the user named does not fall back to a stand-in: it fails, and
    # the reason names the draft model, not the model, and the way to do without it.
    with pytest.raises(ValueError, match=r"InferApp.draft_model .*no-such-model.*nothing is there.*'ngram'"):
        load_engine(ServiceConfig(model=str(tiny_model_dir), draft_model=missing))


def test_a_long_history_is_caught_up_a_chunk_a_step_not_in_one_stall(tiny_model_dir: Path) -> None:
    from jupyter_infer.speculative.draft_model import CATCH_UP_TOKENS

    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, draft_model=str(tiny_model_dir))
    engine.text.eos_token_ids = frozenset()
    engine.configure_speculation("draft", 4, 8)
    seq = _seq(engine, " ".join(FRESH * 12), 40)
    assert len(seq.prompt_ids) > 2 * CATCH_UP_TOKENS
    sampled = engine.execute(keeping(engine, 0, [seq]))
    fed = []
    for _ in range(6):
        seq.output_ids += sampled[0].tokens
        sampled = engine.execute(keeping(engine, 0, [seq], [seq.id], guesses=[4]))
        fed.append(len(_draft_kv(engine, seq.id).fed))
    history = len(seq.prompt_ids)
    steps = -(-history // CATCH_UP_TOKENS)  # chunks its history takes, then it guesses
    assert fed[: steps - 1] == [CATCH_UP_TOKENS * (i + 1) for i in range(steps - 1)]
    assert fed[steps - 1] >= history and sampled[0].proposed  # caught up: it guesses
