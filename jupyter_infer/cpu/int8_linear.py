"""8-bit weights on the CPU in llama.cpp's q8_0 form (``InferApp.quantize = "int8"``): groups of 32
along the input, an int8 each and a float16 scale a group (8.5 bits a weight), times int8
activations quantized per group, in our own kernel (``int8.c``, in our CPU kernel
library).

Why not fbgemm's int8, which served ``int8`` before (docs/engine.md, "int8 in q8_0's form"):
each of its calls cost ~20 µs of fixed work, ~3.4 ms of a 0.5 B model's ~20 ms one-row step,
and it shares one activation scale between a step's rows, so a row's numbers depended on its
batch-mates. Ours groups the activations per row, joins the int4 path's one-call decode step
(``decode_layers``) and its huge pages, and reads a layout built for it: blocks of 16 outputs
whose weights a broadcast row meets 64 at a time.
"""

from __future__ import annotations

import torch

from . import kernels, weight_arena
from .joint_linears import JointLinears
from .kernel_linear import GROUP, KernelLinear, RowReader, own_bias, row_chunks

BLOCK = 16  # outputs a block


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` (K a multiple of 32) -> the kernel's blocks (int8) and scales (float16)."""
    w = weight.detach().float().contiguous()
    n, k = w.shape
    blocks = -(-n // BLOCK)
    packed = torch.empty(blocks * BLOCK * k, dtype=torch.int8)
    scales = torch.empty(blocks * BLOCK * (k // GROUP), dtype=torch.float16)
    kernels.library().q8_quantize(w.data_ptr(), n, k, packed.data_ptr(), scales.data_ptr())
    return packed, scales


def dequantize(packed: torch.Tensor, scales: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The float32 ``[N, K]`` weights the blocks and scales stand for."""
    g = k // GROUP
    blocks = packed.numel() // (BLOCK * k)
    # [block, group, word, output, 4 bytes] -> [block, output, group, word, 4 bytes]
    q = packed.view(blocks, g, GROUP // 4, BLOCK, 4).permute(0, 3, 1, 2, 4).reshape(blocks * BLOCK, g, GROUP)
    s = scales.view(blocks, g, BLOCK).permute(0, 2, 1).reshape(blocks * BLOCK, g, 1)
    return (q.float() * s.float()).reshape(blocks * BLOCK, k)[:n]


class Q8Linear(KernelLinear):
    """``y = x W^T + b`` with ``W`` in int8 groups of 32 (q8_0's form); float32 in and out."""

    JOINT = "q8_linears"
    BITS = 8

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, out_features: int, in_features: int,
                 bias: torch.Tensor | None, *, placed: bool = False) -> None:
        """``placed``: the blocks are in huge pages already (the weight cache read them there)."""
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        # In huge pages: every step streams them whole (weight_arena.py).
        keep = (lambda t: t) if placed else weight_arena.place
        self.register_buffer("packed", keep(packed), persistent=False)
        self.register_buffer("scales", keep(scales), persistent=False)
        self.register_buffer("bias", own_bias(bias), persistent=False)
        # The kernel's weight arguments, as JointLinears passes them (q8 has no mins).
        self._weights = (self.packed.data_ptr(), self.scales.data_ptr(), None, out_features,
                         None if self.bias is None else self.bias.data_ptr())
        self._joint = JointLinears([self])

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Q8Linear:
        return cls(*quantize(weight), weight.shape[0], weight.shape[1], bias)

    @classmethod
    def from_rows(cls, rows: RowReader, shape: tuple[int, int], bias: torch.Tensor | None) -> Q8Linear:
        """``from_weight`` of the ``[N, K]`` weight that ``rows`` gives a chunk at a time (its
        float copy is never whole). A chunk is whole blocks of 16 outputs, so its blocks are the
        weight's blocks at the chunk's offset."""
        n, k = shape
        g, blocks = k // GROUP, -(-n // BLOCK)
        packed = torch.empty(blocks * BLOCK * k, dtype=torch.int8)
        scales = torch.empty(blocks * BLOCK * g, dtype=torch.float16)
        for first, stop in row_chunks(n):
            p, s = quantize(rows(first, stop))
            packed[first * k:first * k + p.numel()] = p
            scales[first * g:first * g + s.numel()] = s
        return cls(packed, scales, n, k, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 groups of {GROUP}"

