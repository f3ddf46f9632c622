"""A float model's input embedding held once, or in bfloat16, on the CPU.

Two cases held more than they needed:

- **A tied output head in our float kernel** (``F32Linear``, ``BF16Linear``) is its own packed
  copy of the embedding table, so the model held the table twice: 545 MB more in float32 for
  Qwen2.5-0.5B's 151,936 x 896 (Llama-3.2-1B: 1.05 GB). ``TiedFloatEmbedding`` looks rows up in
  the head's blocks instead: the same numbers (the head holds the weights as they are, or
  bfloat16's rounding, which a bfloat16 model's table is), held once.
- **A bfloat16 checkpoint held as float32** (``hf_load.held_as``, so its decode step runs in C)
  would hold an untied table in float32, twice its bfloat16 bytes. ``BF16Embedding`` keeps it
  in bfloat16, filled a chunk of rows at a time, and gives float32 rows.

Lookups return float32, the model's dtype. Only a plain ``nn.Embedding`` is replaced (Gemma's
scaled one stays), as for the quantized models' int8 embedding (``int8_embedding``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .float_linear import BLOCK, BF16Linear, F32Linear
from .int8_embedding import head_reads, put_input_embedding, table_rows, tied_head
from .kernel_linear import row_chunks


class TiedFloatEmbedding(nn.Module):
    """The input embedding of a float model whose output head is tied to it and is ours:
    lookups read the head's blocks (float32 ``[block, K, 16]``, bfloat16 ``[block, K/2, 16, 2]``)."""

    def __init__(self, head: F32Linear, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.padding_idx = padding_idx
        self.register_buffer("packed", head.packed, persistent=False)  # the head's: one storage

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        block, output = ids // BLOCK, ids % BLOCK
        # Index tensors split by slices: their dimensions come first ([*ids, K] or [*ids, K/2, 2]).
        if self.packed.dim() == 4:
            rows = self.packed[block, :, output, :].flatten(-2)
        else:
            rows = self.packed[block, :, output]
        return rows[..., :self.embedding_dim].to(torch.float32)

    def extra_repr(self) -> str:
        kind = "bfloat16" if self.packed.dtype == torch.bfloat16 else "float32"
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind}, read from the tied output head's blocks"


class BF16Embedding(nn.Module):
    """An embedding table in bfloat16 whose lookups give float32."""

    def __init__(self, shape: tuple[int, int], padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = shape
        self.padding_idx = padding_idx
        self.register_buffer("table", torch.empty(shape, dtype=torch.bfloat16), persistent=False)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int],
                  padding_idx: int | None = None) -> BF16Embedding:
        """Filled a chunk of rows at a time as ``rows(start, stop)`` gives them."""
        table = cls(shape, padding_idx)
        for start, stop in row_chunks(shape[0]):  # the float32 temporaries stay small
            table.table[start:stop] = rows(start, stop)
        return table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids].to(torch.float32)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bfloat16"


def compact_float_embedding(model: nn.Module, rows: Callable[[str, int, int], torch.Tensor] | None = None) -> bool:
    """Hold a float32 model's input embedding once where its tied head is our float kernel's
    (``TiedFloatEmbedding``), or in bfloat16 where its linears are our bfloat16 blocks
    (``BF16Embedding``, from ``rows(name, first, stop)`` or its weight); whether it did."""
    embedding = model.get_input_embeddings()
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return False
    weight = embedding.weight
    if weight.dtype != torch.float32 or head_reads(model, weight):
        return False
    if (head := tied_head(model, F32Linear)) is not None:
        table: nn.Module = TiedFloatEmbedding(head, embedding.padding_idx)
    elif any(type(m) is BF16Linear for m in model.modules()):
        table = BF16Embedding.from_rows(table_rows(model, weight, rows), tuple(weight.shape), embedding.padding_idx)
    else:
        return False
    return put_input_embedding(model, table)
