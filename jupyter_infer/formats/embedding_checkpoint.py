"""Whether a checkpoint folder is an embedding model, and how it pools: what its
sentence-transformers files say (``modules.json``, ``1_Pooling/config.json``), else its
architecture (a body without a head: ``BertModel``, ``XLMRobertaModel``, ``MistralModel``).

A BERT-style encoder pools the mean of its tokens or its first ([CLS]) token; a decoder
embedder (Qwen3-Embedding, e5-mistral, GTE-Qwen) its last token. A causal LM with a head is
no embedding model: it is served as a chat model, and its embeddings pool its last token. A
sequence classifier with one label (bge-reranker, ms-marco cross-encoders) is a reranker: it
reads a query and a document together and scores them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# sentence-transformers' pooling flags, by the names we use.
_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}
_DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2")


@dataclass(frozen=True)
class EmbeddingSpec:
    """How an embedding checkpoint's vectors are made: ``pooling`` "mean", "cls" or "last"; or
    "score": a cross-encoder (a reranker) that scores a pair of texts with one logit."""

    pooling: str
    architecture: str


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _pooling_config(folder: Path) -> str | None:
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    for module in modules if isinstance(modules, list) else []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling"):
            config = _json(folder / str(module.get("path", "1_Pooling")) / "config.json")
            return next((mode for flag, mode in _POOLING.items() if config.get(flag)), "mean")
    return None


def embedding_spec(folder: str | Path) -> EmbeddingSpec | None:
    """The folder's embedding model (``None``: a causal LM, or not a folder of a checkpoint)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    config = _json(folder / "config.json")
    architecture = (config.get("architectures") or [""])[0]
    pooling = _pooling_config(folder)
    if pooling is not None:
        return EmbeddingSpec(pooling, architecture)
    labels = config.get("num_labels", len(config.get("id2label") or {}) or None)
    if architecture.endswith("ForSequenceClassification") and labels == 1:
        return EmbeddingSpec("score", architecture)  # a cross-encoder: one relevance score a pair
    if architecture.endswith("Model") and not architecture.endswith("LMHeadModel"):
        decoder = config.get("model_type") in _DECODERS or config.get("is_decoder")
        return EmbeddingSpec("last" if decoder else "mean", architecture)
    return None
