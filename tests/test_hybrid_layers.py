"""Hybrid models (issue 31): Mamba, linear-attention and convolution layers beside attention
(Granite 4, Qwen3-Next, LFM2) keep per-row states, not columns. Rows that join a running batch
and leave it keep them: greedy answers equal transformers' ``generate`` for each prompt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_hf_engine import LENGTHS, PROMPTS, reference, run_with_late_joiners

from jupyter_infer.engine import kv_cache
from jupyter_infer.engine.hf import HFEngine

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
}


def hybrid_checkpoint(kind: str, tokenizer_dir: Path, folder: Path) -> Path:
    """A random-weight ``kind`` model with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    folder.mkdir(parents=True)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, vocab_size=len(tokenizer), **SMALL, **HYBRIDS[kind])
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["continuous", "window"])
@pytest.mark.parametrize("kind", sorted(HYBRIDS))
async def test_hybrid_rows_join_and_leave_a_batch_and_equal_generate(kind: str, mode: str, tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    folder = hybrid_checkpoint(kind, tiny_model_dir, tmp_path / kind)
    engine = HFEngine(str(folder), dtype="float32", num_threads=1)
    layers = kv_cache.new_cache(engine.model.config).layers
    assert any(not kv_cache.holds_kv(layer) for layer in layers)  # really a model with state layers
    results = await run_with_late_joiners(engine, mode)
    if mode == "continuous":  # the late pair joined the batch already running
        assert results[3].batch_id != results[0].batch_id and results[3].batch_size > 2
    for result, prompt, n in zip(results, PROMPTS, LENGTHS, strict=True):
        assert list(result.token_ids) == reference(folder, prompt, n), (kind, prompt)
    shutil.rmtree(folder)
