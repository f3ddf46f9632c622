"""make-model's embedding shapes: ``embed-tiny``, a BERT encoder of 2 layers of 128 with random
weights, our small trained tokenizer, and the sentence-transformers files that say how it pools
(mean) and that it normalizes; ``rerank-tiny``, the same encoder with a one-label
classification head and a tokenizer that writes pairs as ``[CLS] a [SEP] b [SEP]`` (a
cross-encoder, as bge-reranker and ms-marco's are). Checkpoints as the Hub's look, for the tests."""

from __future__ import annotations

import json
import pathlib

import torch
from tokenizers import processors
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    PreTrainedTokenizerFast,
)

PAIR_TOKENS = ("[CLS]", "[SEP]")

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


def as_pair_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """``tokenizer`` (trained with ``PAIR_TOKENS``) writing BERT's markers: one text as
    ``[CLS] a [SEP]``, a pair as ``[CLS] a [SEP] b [SEP]`` (the second with token type 1)."""
    cls, sep = (tokenizer.convert_tokens_to_ids(t) for t in PAIR_TOKENS)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.cls_token, tokenizer.sep_token = PAIR_TOKENS
    return tokenizer


def build_reranker(staging: pathlib.Path, tokenizer: PreTrainedTokenizerFast, seed: int,
                   positions: int) -> BertForSequenceClassification:
    """A cross-encoder: the encoder with a one-label head, written into ``staging``."""
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=positions, num_labels=1,
                        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification._from_config(config, dtype=torch.float32)
    model.eval()
    model.save_pretrained(staging)
    return model
