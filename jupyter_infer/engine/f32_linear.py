"""float32 linears on the CPU in our own kernel (``f32_kernel.c``), where the int4 library builds.

A float32 decode step at one row is a read of every weight. oneDNN's prepacked product, which
served float32 before, read them at ~22-27 GB/s on a 2-core AVX-512 CPU at one row, against ~33
for llama.cpp's f32 (docs/engine.md, "float32 in our kernel"). Ours keeps each weight in
blocks of 16 outputs, k-major (lane o of a block's k-th vector is output o's weight k): one row
is a plain stream of the block, and up to 8 rows share each read. The same linears join the
one-call decode step (``decode_layers``) and the C ops of the Llama family's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from . import weight_arena
from .q4_linear import Int4Linears

BLOCK = 16  # outputs a block


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` -> the kernel's blocks ``[ceil(N/16), K, 16]`` (a last block's missing
    outputs are zero)."""
    w = weight.detach().float()
    n, k = w.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k) if n % BLOCK else None
    if padded is not None:
        padded[:n] = w
        w = padded
    return w.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def unpack(blocks: torch.Tensor, n: int) -> torch.Tensor:
    """The ``[N, K]`` weight the blocks hold."""
    return blocks.transpose(1, 2).reshape(-1, blocks.shape[1])[:n]


class F32Linear(nn.Module):
    """``y = x W^T + b`` in float32, ``W`` in the kernel's blocks."""

    JOINT = "f32_linears"  # the kernel function Int4Linears calls for a joint of these

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # In huge pages: every step streams them whole (weight_arena.py).
        self.register_buffer("packed", weight_arena.place(pack(weight)), persistent=False)
        # A copy: the kernel holds its address, and the model's own bias may be a view of the
        # checkpoint's memory map.
        bias = None if bias is None else bias.detach().to(torch.float32, copy=True).contiguous()
        self.register_buffer("bias", bias, persistent=False)
        # The kernel's weight arguments, as Int4Linears passes them (no scales, no mins).
        self._weights = (self.packed.data_ptr(), None, None, self.out_features,
                         None if self.bias is None else self.bias.data_ptr())
        self._joint = Int4Linears([self])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return self._joint(x.float().contiguous()).to(x.dtype)
        return self._joint(x)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        """``model.to()`` and the like leave the weights as they are: the kernel holds their
        addresses."""
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float32 blocks of {BLOCK}"
