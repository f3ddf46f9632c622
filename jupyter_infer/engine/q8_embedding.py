"""A quantized model's input embedding in llama.cpp's q8_0 form: int8 in groups of 32 along the
hidden width, a float16 scale a group (8.5 bits a weight).

With int4 or int8 linears the float32 embedding is the largest float tensor left, and with a
real checkpoint's vocabulary the largest of all: Qwen2.5-0.5B's 151,936 x 896 is 545 MB in
float32, against ~200 MB for every int4 linear of the model; Llama-3.2-1B's 128,256 x 2048 is
1.05 GB. A step looks up a few rows, so dequantizing them costs nothing measurable. llama.cpp
keeps ``token_embd`` in q8_0 or narrower too. A tied output head is its own quantized copy
already (``cpu_linear``), so the embedding's float32 weight is then held by nothing else.

Only a plain ``nn.Embedding`` is replaced: subclasses that scale or otherwise change what a
lookup returns (Gemma's) stay as they are.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32
_CHUNK = 4096  # rows quantized at a time: the float temporaries stay small for any vocabulary


class Q8Embedding(nn.Module):
    """An embedding table in int8 groups of 32 with float16 scales; lookups give the table's
    former dtype."""

    def __init__(self, weight: torch.Tensor, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.padding_idx = padding_idx
        self.dtype = weight.dtype
        groups = self.embedding_dim // GROUP
        packed = torch.empty(weight.shape, dtype=torch.int8)
        scales = torch.empty((self.num_embeddings, groups), dtype=torch.float16)
        with torch.no_grad():
            for start in range(0, self.num_embeddings, _CHUNK):
                w = weight[start:start + _CHUNK].float().reshape(-1, groups, GROUP)
                d = (w.abs().amax(-1) / 127).half()  # q8_0's scale, as stored
                inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
                q = (w * inv.unsqueeze(-1)).round().clamp(-127, 127)
                packed[start:start + _CHUNK] = q.to(torch.int8).reshape(-1, self.embedding_dim)
                scales[start:start + _CHUNK] = d
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scales", scales, persistent=False)

    @classmethod
    def fits(cls, module: nn.Module) -> bool:
        """Whether ``module`` is an embedding this class can stand in for."""
        return (type(module) is nn.Embedding and module.embedding_dim % GROUP == 0 and module.max_norm is None
                and module.weight.device.type == "cpu")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed[ids].reshape(*ids.shape, -1, GROUP).to(torch.float32)
        out = rows * self.scales[ids].to(torch.float32).unsqueeze(-1)
        return out.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def dequantized(self) -> torch.Tensor:
        """The table the int8 groups stand for, ``[num_embeddings, embedding_dim]``."""
        return self.forward(torch.arange(self.num_embeddings))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 groups of {GROUP} (q8_0's form)"


def quantize_input_embedding(model: nn.Module) -> bool:
    """Put ``model``'s input embedding in ``Q8Embedding`` where it fits and nothing else holds
    its weight (a tied output head still reading it would keep the float32 table alive);
    whether it did."""
    embedding = model.get_input_embeddings()
    if not Q8Embedding.fits(embedding):
        return False
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is embedding.weight:
        return False
    try:
        model.set_input_embeddings(Q8Embedding(embedding.weight, embedding.padding_idx))
    except NotImplementedError:  # a model that does not say where its embedding lives
        return False
    return True
