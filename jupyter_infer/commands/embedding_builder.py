"""make-model's embedding shape (``embed-tiny``): a BERT encoder of 2 layers of 128 with random
weights, our small trained tokenizer, and the sentence-transformers files that say how it
pools (mean) and that it normalizes: an embedding checkpoint as the Hub's look, for the tests."""

from __future__ import annotations

import json
import pathlib

import torch
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def build_embedding_model(staging: pathlib.Path, tokenizer: PreTrainedTokenizerFast, seed: int,
                          positions: int) -> BertModel:
    """The encoder and its sentence-transformers files, written into ``staging``."""
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=positions,
                        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertModel._from_config(config, dtype=torch.float32)
    model.eval()
    model.save_pretrained(staging)
    (staging / "modules.json").write_text(json.dumps(MODULES, indent=2))
    pooling = {"word_embedding_dimension": 128, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False}
    (staging / "1_Pooling").mkdir()
    (staging / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (staging / "2_Normalize").mkdir()
    (staging / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "cosine"}))
    return model
