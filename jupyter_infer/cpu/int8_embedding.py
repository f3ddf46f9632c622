"""A quantized model's input embedding in llama.cpp's q8_0 form: int8 in groups of 32 along the
hidden width, a float16 scale a group (8.5 bits a weight).

With int4 or int8 linears the float32 embedding is the largest float tensor left, and with a
real checkpoint's vocabulary the largest of all: Qwen2.5-0.5B's 151,936 x 896 is 545 MB in
float32, against ~200 MB for every int4 linear of the model; Llama-3.2-1B's 128,256 x 2048 is
1.05 GB. A step looks up a few rows, so dequantizing them costs nothing measurable. llama.cpp
keeps ``token_embd`` in q8_0 or narrower too. A tied output head is its own quantized copy
already (``model_linears``), so the embedding's float32 weight is then held by nothing else; where
that head is our int8 (q8_0's form too, the same rounding), ``TiedQ8Embedding`` looks rows up in
the head's blocks, and the table is held once, as llama.cpp holds a tied ``token_embd`` (a
Qwen2.5-0.5B q4_0 file's is q8_0: 138 MB, not twice that).

Only a plain ``nn.Embedding`` is replaced: subclasses that scale or otherwise change what a
lookup returns (Gemma's) stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .int8_linear import BLOCK, Q8Linear
from .kernel_linear import GROUP, KernelLinear, row_chunks


class Q8Embedding(nn.Module):
    """An embedding table in int8 groups of 32 with float16 scales; lookups give the table's
    former dtype."""

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype, padding_idx: int | None = None) -> None:
        """An empty table of ``shape`` whose lookups give ``dtype``: ``of`` and ``from_rows`` fill it."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = shape
        self.padding_idx = padding_idx
        self.dtype = dtype
        self.register_buffer("packed", torch.empty(shape, dtype=torch.int8), persistent=False)
        self.register_buffer("scales", torch.empty((shape[0], shape[1] // GROUP), dtype=torch.float16),
                             persistent=False)

    @classmethod
    def of(cls, weight: torch.Tensor, padding_idx: int | None = None) -> Q8Embedding:
        """``weight`` ``[num_embeddings, embedding_dim]`` in q8_0's form."""
        return cls.from_rows(lambda start, stop: weight[start:stop], tuple(weight.shape), weight.dtype, padding_idx)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int], dtype: torch.dtype,
                  padding_idx: int | None = None) -> Q8Embedding:
        """Quantized a chunk of rows at a time as ``rows(start, stop)`` gives them (read from the
        checkpoint's file, say): the float table need never be whole in memory."""
        table = cls(shape, dtype, padding_idx)
        for start, stop in row_chunks(shape[0]):  # the float temporaries stay small for any vocabulary
            table._put(start, rows(start, stop))
        return table

    @torch.no_grad()
    def _put(self, start: int, rows: torch.Tensor) -> None:
        """q8_0's rounding of ``rows``, stored from row ``start`` on."""
        w = rows.to(torch.float32, copy=True).reshape(rows.shape[0], -1, GROUP)
        d = (w.abs().amax(-1) / 127).half()  # q8_0's scale, as stored
        inv = d.float()
        inv = torch.where(inv > 0, 1 / inv, inv)
        w.mul_(inv.unsqueeze(-1)).round_().clamp_(-127, 127)
        self.packed[start:start + rows.shape[0]] = w.reshape(rows.shape[0], -1).to(torch.int8)
        self.scales[start:start + rows.shape[0]] = d

    @classmethod
    def fits(cls, module: nn.Module) -> bool:
        """Whether ``module`` is an embedding this class can stand in for."""
        return (type(module) is nn.Embedding and module.embedding_dim % GROUP == 0 and module.max_norm is None
                and module.weight.device.type in ("cpu", "meta"))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows, scales = self._groups(ids)
        out = rows.to(torch.float32) * scales.to(torch.float32).unsqueeze(-1)
        return out.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def _groups(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' int8 ``[*ids, G, 32]`` and their scales ``[*ids, G]``."""
        return self.packed[ids].reshape(*ids.shape, -1, GROUP), self.scales[ids]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 groups of {GROUP} (q8_0's form)"


class TiedQ8Embedding(Q8Embedding):
    """The input embedding of a model whose output head is tied to it and is our int8
    (``Q8Linear``): lookups read the head's blocks, so the table is held once. Its rows are what
    ``Q8Embedding.of`` of the float table would hold: the same q8_0 rounding."""

    def __init__(self, head: Q8Linear, dtype: torch.dtype, padding_idx: int | None = None) -> None:
        nn.Module.__init__(self)  # not Q8Embedding's: no table of its own
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.padding_idx, self.dtype = padding_idx, dtype
        groups, blocks = head.in_features // GROUP, -(-head.out_features // BLOCK)
        # Views of the head's buffers ([block, group, word, output, 4 bytes]; [block, group,
        # output]): one storage, which resident_bytes counts once.
        self.register_buffer("packed", head.packed.view(blocks, groups, GROUP // 4, BLOCK, 4), persistent=False)
        self.register_buffer("scales", head.scales.view(blocks, groups, BLOCK), persistent=False)

    def _groups(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block, output = ids // BLOCK, ids % BLOCK
        # Index tensors split by slices: their dimensions come first ([*ids, G, word, 4 bytes]).
        return self.packed[block, :, :, output, :].flatten(-2), self.scales[block, :, output]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, read from the tied output head's blocks"


def quantize_input_embedding(model: nn.Module,
                             rows: Callable[[str, int, int], torch.Tensor] | None = None) -> bool:
    """Put ``model``'s input embedding in ``Q8Embedding`` where it fits and nothing else holds
    its weight (a tied output head still reading it would keep the float32 table alive);
    whether it did. ``rows(name, first, stop)``: where the table's rows are read from (the
    checkpoint's file, for a model built on the meta device), a chunk at a time, so the float
    table is never whole in memory; by default its weight."""
    embedding = model.get_input_embeddings()
    if not Q8Embedding.fits(embedding) or head_reads(model, embedding.weight):
        return False
    weight = embedding.weight
    if (head := tied_head(model, Q8Linear)) is not None:
        table = TiedQ8Embedding(head, weight.dtype, embedding.padding_idx)
    else:
        table = Q8Embedding.from_rows(table_rows(model, weight, rows), tuple(weight.shape), weight.dtype,
                                      embedding.padding_idx)
    return put_input_embedding(model, table)


# What the int8 embedding and the float ones (float_embedding) share: the tied head whose blocks
# can serve the lookups, where the table's rows are read from, and the swap itself.
def tied_head(model: nn.Module, kind: type[KernelLinear]) -> KernelLinear | None:
    """The output head where the config ties it to the input embedding and it is ours of
    ``kind`` with the table's shape (its blocks can serve the lookups); else None."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    head, weight = model.get_output_embeddings(), getattr(model.get_input_embeddings(), "weight", None)
    if not getattr(config, "tie_word_embeddings", False) or not isinstance(head, kind) or weight is None:
        return None
    return head if (head.out_features, head.in_features) == tuple(weight.shape) else None


def head_reads(model: nn.Module, weight: torch.Tensor) -> bool:
    """Whether a float output head still reads ``weight`` (it would keep the table alive)."""
    head = model.get_output_embeddings()
    return head is not None and getattr(head, "weight", None) is weight


def table_rows(model: nn.Module, weight: torch.Tensor,
               rows: Callable[[str, int, int], torch.Tensor] | None) -> Callable[[int, int], torch.Tensor]:
    """``(first, stop) -> rows`` of the embedding's table: from ``rows(name, first, stop)`` (the
    checkpoint's file, for a model built on meta) or else from ``weight``."""
    if rows is None:
        return lambda first, stop: weight[first:stop]
    name = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is weight)
    return lambda first, stop: rows(name, first, stop)


def put_input_embedding(model: nn.Module, table: nn.Module) -> bool:
    """``model.set_input_embeddings(table)``; False where the model does not say where its
    embedding lives."""
    try:
        model.set_input_embeddings(table)
    except NotImplementedError:
        return False
    return True
