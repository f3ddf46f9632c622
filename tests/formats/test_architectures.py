"""The architectures transformers runs, served batched (issue 31): tiny random checkpoints of
each, rows joining a running batch and leaving it, greedy answers equal to transformers'
``generate`` for each prompt. Hybrid models (Granite 4, Qwen3-Next, LFM2, Falcon-H1) keep
per-row states beside their attention; Gemma 2/3 and Mistral have sliding windows, here
shorter than the prompts (a prompt past the window failed: Gemma 3 1B's is 512 tokens);
Falcon's layers keep a forward's keyword arguments from its attention, so it runs a forward
per bucket (its rows' KV never reached the batch's cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_hf_engine import LENGTHS, PROMPTS, _seq, reference, run_with_late_joiners

from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.engine.kv import kv_cache

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
HYBRIDS = {
    "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=4,
                             mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_expand=2, num_local_experts=0,
                             shared_intermediate_size=128, position_embedding_type="rope"),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"] * 2, head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "lfm2": dict(layer_types=["conv", "full_attention"] * 2),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                      head_dim=16),
}
SLIDING = {
    "gemma2": dict(head_dim=16, sliding_window=8),
    "gemma3_text": dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2),
    "mistral": dict(sliding_window=8),
}
OTHERS = {
    "llama": {}, "qwen2": {}, "qwen3": dict(head_dim=16), "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                               moe_intermediate_size=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "gemma": dict(head_dim=16), "phi3": dict(pad_token_id=0),
    "olmo2": {}, "granite": {}, "smollm3": dict(pad_token_id=0), "starcoder2": dict(sliding_window=None),
    "gpt_neox": dict(num_key_value_heads=None), "cohere": {},
    # Its layers do not pass a forward's keyword arguments to attention: no ragged steps.
    "falcon": dict(num_key_value_heads=None, intermediate_size=None),
}
ARCHITECTURES = {**HYBRIDS, **SLIDING, **OTHERS}


def options(kind: str) -> dict:
    """``kind``'s tiny config: the small dims, its own, less those it sets to None (not given)."""
    return {k: v for k, v in {**SMALL, **ARCHITECTURES[kind]}.items() if v is not None or k == "sliding_window"}


def checkpoint(kind: str, tokenizer_dir: Path, folder: Path) -> Path:
    """A random-weight ``kind`` model with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    folder.mkdir(parents=True)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, vocab_size=len(tokenizer), **options(kind))
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
async def test_rows_join_and_leave_a_batch_and_equal_generate(kind: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = checkpoint(kind, tiny_model_dir, tmp_path / kind)
    engine = HFEngine(str(folder), dtype="float32", num_threads=1)
    layers = kv_cache.new_cache(engine.model.config).layers
    if kind in HYBRIDS:  # really a model with state layers
        assert any(kv_cache.holds_state(layer) for layer in layers)
    if kind == "falcon":  # status says how its steps run
        assert not engine.ragged and engine.info.details["forward"] == "transformers' modules, a forward per bucket"
    results = await run_with_late_joiners(engine, "continuous")
    assert results[3].batch_id != results[0].batch_id and results[3].batch_size > 2  # the late pair joined
    for result, prompt, n in zip(results, PROMPTS, LENGTHS, strict=True):
        assert list(result.token_ids) == reference(folder, prompt, n), (kind, prompt)
    shutil.rmtree(folder)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["granitemoehybrid", "gemma3_text"])
async def test_window_mode_too(kind: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = checkpoint(kind, tiny_model_dir, tmp_path / kind)
    results = await run_with_late_joiners(HFEngine(str(folder), dtype="float32", num_threads=1), "window")
    for result, prompt, n in zip(results, PROMPTS, LENGTHS, strict=True):
        assert list(result.token_ids) == reference(folder, prompt, n), (kind, prompt)


@pytest.mark.parametrize(("kind", "attention"), [("granitemoehybrid", 2), ("qwen3_next", 2), ("lfm2", 2),
                                                 ("falcon_h1", 4), ("gemma3_text", 4), ("qwen2", 4)])
def test_the_kv_gauge_counts_the_layers_that_keep_keys_and_values(kind: str, attention: int) -> None:
    """A hybrid's recurrent layers hold a state of fixed size, not keys and values per token:
    the KV gauge (infer/status, the buckets' budget) counts only its attention layers."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(kind, vocab_size=100, **options(kind))
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert kv_cache.bytes_per_token(config, torch.float32) == 2 * attention * heads * head_dim * 4


def test_a_hybrids_recurrent_states_are_not_counted_as_wasted_kv(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A recurrent layer's state is a fixed size per row: infer/metrics reports it apart
    (``state_bytes``), and the KV waste ratio is the attention layers' alone (found in a
    review: a short row of a hybrid read as several times wasted)."""
    from jupyter_infer.engine import StepPlan

    folder = checkpoint("granitemoehybrid", tiny_model_dir, tmp_path / "hybrid")
    engine = HFEngine(str(folder), dtype="float32", num_threads=1)
    seqs = [_seq(engine, p, 4) for p in PROMPTS[:2]]
    engine.execute(StepPlan.of(0, seqs))
    usage = engine.kv_usage()
    batch = engine.decoding_buckets()[0]
    states = kv_cache.state_bytes(batch.cache)
    assert usage.state_bytes == states > 0
    assert usage.bytes_held == kv_cache.bytes_held(batch.cache)  # the attention layers' buffers only
    # Those are padding, a spare column per token it may still get (4) and the real tokens.
    width = batch.mask.shape[1] + 4
    assert usage.bytes_held <= len(seqs) * width * usage.bytes_per_token
    assert usage.to_json()["state_bytes"] == states
