"""A BERT-family encoder's forward over packed tokens: an embedding batch's texts one after
another, no padding, through every linear and norm (a batch of 64 short texts padded to its
longest was a third more rows than tokens); only attention sees each text's own columns, in
one padded SDPA call with a key mask. Query, key and value are one prepacked oneDNN GEMM, the
feed-forward's GELU runs inside its GEMM (oneDNN's post-op), as llama.cpp's graph does.

``PackedEncoder.of(model)`` takes BERT (and the models with its module names and absolute
positions: RoBERTa, XLM-R); any other encoder keeps transformers' forward (``pooling.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("bert", "roberta", "xlm-roberta")


def _packed(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous()), \
        None if bias is None else bias.detach().contiguous()


def _linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor | None], post: str = "none") -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed[0], packed[1], post, [], "none" if post == "gelu" else "")


class PackedEncoder:
    """The encoder's weights, prepacked; ``hidden(ids, types)``: each text's last hidden states."""

    def __init__(self, body: nn.Module) -> None:
        config = body.config
        self.body = body
        self.heads = config.num_attention_heads
        self.eps = config.layer_norm_eps
        # RoBERTa's positions start after its padding index.
        self.first_position = body.embeddings.padding_idx + 1 if config.model_type != "bert" else 0
        self.layers = []
        for layer in body.encoder.layer:
            a = layer.attention.self
            qkv = _packed(torch.cat([a.query.weight, a.key.weight, a.value.weight]),
                          torch.cat([a.query.bias, a.key.bias, a.value.bias]))
            self.layers.append((qkv, _packed(layer.attention.output.dense.weight, layer.attention.output.dense.bias),
                                layer.attention.output.LayerNorm,
                                _packed(layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                                _packed(layer.output.dense.weight, layer.output.dense.bias), layer.output.LayerNorm))

    @classmethod
    def of(cls, body: nn.Module) -> PackedEncoder | None:
        """For a float32 BERT-family body on the CPU with oneDNN; else ``None``."""
        config = body.config
        if (config.model_type not in FAMILIES or getattr(config, "position_embedding_type", "absolute") != "absolute"
                or config.hidden_act != "gelu" or not torch.backends.mkldnn.is_available()
                or next(body.parameters()).dtype != torch.float32 or next(body.parameters()).device.type != "cpu"):
            return None
        return cls(body)

    def hidden(self, prompts: list[list[int]], types: list[list[int]] | None = None) -> torch.Tensor:
        """The last hidden states of every text's tokens, packed ``[tokens, hidden]`` in order."""
        lengths = torch.tensor([len(p) for p in prompts])
        ids = torch.tensor([t for p in prompts for t in p])
        positions = torch.cat([torch.arange(n) for n in lengths.tolist()]) + self.first_position
        emb = self.body.embeddings
        h = emb.word_embeddings(ids) + emb.position_embeddings(positions)
        kinds = torch.tensor([t for row in types for t in row]) if types is not None else torch.zeros_like(ids)
        h = emb.LayerNorm(h + emb.token_type_embeddings(kinds))
        mask = torch.arange(int(lengths.max()))[None] < lengths[:, None]  # [texts, longest]: real columns
        real = mask.view(-1).nonzero().squeeze(1)  # where each token sits in the padded layout
        # Pad columns stay zero: every layer writes the real ones only.
        padded = h.new_zeros((mask.numel(), 3 * h.shape[-1]))
        for qkv, out, norm1, up, down, norm2 in self.layers:
            h = norm1(_linear(self._attention(_linear(h, qkv), mask, real, padded), out) + h)
            h = norm2(_linear(_linear(h, up, "gelu"), down) + h)
        return h

    def _attention(self, qkv: torch.Tensor, mask: torch.Tensor, real: torch.Tensor,
                   padded: torch.Tensor) -> torch.Tensor:
        """Each text's attention over its own tokens: copied into ``[texts, longest]``, one SDPA
        call with the key mask, gathered back."""
        texts, longest = mask.shape
        padded.index_copy_(0, real, qkv)
        q, k, v = padded.view(texts, longest, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return o.transpose(1, 2).reshape(texts * longest, -1).index_select(0, real)


def pooled(hidden: torch.Tensor, lengths: list[int], mode: str) -> torch.Tensor:
    """Packed hidden states pooled per text: the mean of its tokens, its first, or its last."""
    ends = torch.tensor(lengths).cumsum(0)
    starts = ends - torch.tensor(lengths)
    if mode == "cls":
        return hidden[starts]
    if mode == "last":
        return hidden[ends - 1]
    running = F.pad(hidden.double().cumsum(0), (0, 0, 1, 0))  # a text's sum: two rows of the running sum
    return ((running[ends] - running[starts]) / torch.tensor(lengths, dtype=torch.float64)[:, None]).to(hidden.dtype)
