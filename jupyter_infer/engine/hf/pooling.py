"""Embeddings in the engine's step: each prompt run whole through the model's body (no head,
no KV kept), pooled as the model's embeddings are (its last token's final hidden state for a
causal LM or a decoder embedder, the mean of its tokens or its first for a BERT-style encoder:
``formats/embedding_checkpoint``) and normalized to length 1. Rows of like length run together,
right-padded, each pooled over its own tokens only."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Tokens of one forward at most (rows × the longest): bounds the activations of a batch of
# long texts; a batch of 64 short texts is one forward.
FORWARD_TOKENS = 8192


def groups(lengths: list[int], budget: int = FORWARD_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` in groups of like length whose padded size stays in ``budget``
    (a text longer than it alone)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[i] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``hidden`` ``[rows, width, size]`` pooled over each row's real columns (``mask``)."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
    last = mask.sum(-1) - 1  # right-padded: each row's last real column
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _padded(prompts: list[list[int]], group: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's prompts right-padded to one width, and their mask."""
    width = max(len(prompts[i]) for i in group)
    ids = torch.full((len(group), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(group), width), dtype=torch.long)
    for row, i in enumerate(group):
        ids[row, : len(prompts[i])] = torch.tensor(prompts[i])
        mask[row, : len(prompts[i])] = 1
    return ids, mask


def embeddings(body: torch.nn.Module, prompts: list[list[int]], pad_id: int, device: str,
               mode: str = "last") -> list[list[float]]:
    """Each prompt's normalized, pooled vector from ``body`` (a model's base, no head)."""
    out: list[list[float]] = [[] for _ in prompts]
    for group in groups([len(p) for p in prompts]):
        ids, mask = (t.to(device) for t in _padded(prompts, group, pad_id))
        with torch.inference_mode():
            hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        vectors = F.normalize(pool(hidden, mask, mode).float(), dim=-1).cpu().tolist()
        for row, i in enumerate(group):
            out[i] = vectors[row]
    return out


def pair_types(ids: torch.Tensor, sep_id: int | None) -> torch.Tensor:
    """BERT's token types of pairs: 0 up to the first separator, 1 after it (what its tokenizer
    gives ``tokenizer(query, document)``)."""
    if sep_id is None:
        return torch.zeros_like(ids)
    first = (ids == sep_id).int().cumsum(-1)
    return ((first - (ids == sep_id).int()) > 0).long()


def scores(classifier: torch.nn.Module, pairs: list[list[int]], pad_id: int, device: str,
           sep_id: int | None) -> list[list[float]]:
    """A cross-encoder's score of each pair (its one logit), as a one-value vector."""
    out: list[list[float]] = [[] for _ in pairs]
    typed = getattr(classifier.config, "type_vocab_size", 1) > 1
    for group in groups([len(p) for p in pairs]):
        ids, mask = _padded(pairs, group, pad_id)
        extra = {"token_type_ids": pair_types(ids, sep_id).to(device)} if typed else {}
        with torch.inference_mode():
            logits = classifier(input_ids=ids.to(device), attention_mask=mask.to(device), **extra).logits
        for row, i in enumerate(group):
            out[i] = [float(logits[row, 0])]
    return out
