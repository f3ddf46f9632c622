"""float32 and bfloat16 linears on the CPU in our own kernel (``float.c``), where the int4
library builds.

A float32 decode step at one row is a read of every weight. oneDNN's prepacked product, which
served float32 before, read them at ~22-27 GB/s on a 2-core AVX-512 CPU at one row, against ~33
for llama.cpp's f32 (docs/engine.md, "float32 in our kernel"). Ours keeps each weight in
blocks of 16 outputs, k-major (lane o of a block's k-th vector is output o's weight k): one row
is a plain stream of the block, and up to 8 rows share each read. The same linears join the
one-call decode step (``decode_layers``) and the C ops of the Llama family's forward (float32
models). bfloat16 weights are blocks of the same outputs in 2 bytes a weight, in pairs along
the input: AVX512-BF16's ``vdpbf16ps`` takes them as they are (32 products an instruction,
oneDNN's rate at many rows), and elsewhere they are widened exactly to float32.
"""

from __future__ import annotations

import torch

from . import weight_arena
from .joint_linears import JointLinears
from .kernel_linear import KernelLinear, own_bias

BLOCK = 16  # outputs a block


def pack(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight [N, K]`` -> the kernel's blocks in ``dtype``: float32 ``[ceil(N/16), K, 16]``;
    bfloat16 in pairs along the input, ``[ceil(N/16), ceil(K/2), 16, 2]`` (missing outputs and a
    last odd input are zero)."""
    w = weight.detach().to(dtype)
    n, k = w.shape
    blocks = -(-n // BLOCK)
    width = k + k % 2 if dtype == torch.bfloat16 else k
    if (blocks * BLOCK, width) != (n, k):
        padded = torch.zeros(blocks * BLOCK, width, dtype=dtype)
        padded[:n, :k] = w
        w = padded
    if dtype == torch.bfloat16:
        return w.view(blocks, BLOCK, width // 2, 2).permute(0, 2, 1, 3).contiguous()
    return w.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def unpack(blocks: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The ``[N, K]`` weight the blocks hold."""
    if blocks.dim() == 4:  # bfloat16 pairs
        return blocks.permute(0, 2, 1, 3).reshape(blocks.shape[0] * BLOCK, -1)[:n, :k]
    return blocks.transpose(1, 2).reshape(-1, blocks.shape[1])[:n, :k]


class F32Linear(KernelLinear):
    """``y = x W^T + b`` in float32, ``W`` in the kernel's blocks."""

    JOINT = "f32_linears"
    BITS = 32
    DTYPE = torch.float32  # the weights'

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # In huge pages: every step streams them whole (weight_arena.py).
        self.register_buffer("packed", weight_arena.place(pack(weight, self.DTYPE)), persistent=False)
        self.register_buffer("bias", own_bias(bias), persistent=False)
        # The kernel's weight arguments, as JointLinears passes them (no scales, no mins).
        self._weights = (self.packed.data_ptr(), None, None, self.out_features,
                         None if self.bias is None else self.bias.data_ptr())
        self._joint = JointLinears([self])

    def extra_repr(self) -> str:
        kind = str(self.DTYPE).removeprefix("torch.")
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind} blocks of {BLOCK}"


class BF16Linear(F32Linear):
    """The same with ``W`` in bfloat16 (half the read), in pairs along the input. With
    AVX512-BF16 the activations meet it rounded to bfloat16 (a bfloat16 model's are already),
    else widened; sums in float32, output in the input's dtype."""

    JOINT = "bf16_linears"
    BITS = 16
    DTYPE = torch.bfloat16
