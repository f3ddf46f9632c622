"""4-bit weights on the CPU: group-wise int4 linears (``InferApp.quantize = "int4"``).

A decode step at a few rows reads every weight once, so its cost is the weights' bytes. Here
each group of 32 weights along the input is 16 bytes of nibbles and a float16 scale
(``w = (q - 8) * scale``, 4.5 bits a weight: GGUF's q4_0 block, stored as two arrays). GGUF's
q4_1 and q4_K blocks carry a min as well (``w = q * scale + min``, 5 bits); those are served as
they are, with a third array.
The product runs in ``int4.c``: activations quantized per call to int8 in the same
groups (llama.cpp's q8_0), integer dot products (AVX2's ``maddubs``/``madd``, VNNI's
``dpbusd`` where the CPU has it), one FMA per group with the two scales; OpenMP threads, the
same runtime torch runs on, split the outputs. The module takes the weights in the row form
(``quantize``'s and GGUF's: an output's groups one after another) and keeps them in the
kernel's blocks of 16 outputs (``to_blocks``), where a broadcast row meets 16 outputs' nibbles
at once; ``Int4Linear.rows`` gives the row form back.

Why our own kernel (docs/engine.md, "4-bit weights"): torch's ``_weight_int4pack_mm_for_cpu``
is 5-10x slower than float32 with float32 activations and about float32's speed with bf16
ones on an AVX2 CPU; ours reads the 4-bit weights at several times float32's speed at one row.

The kernel is C (``csrc/int4.c``), built at first use for this CPU and probed in a child
process (``build.py``), reached through ``kernels.py``. Where there is no compiler, no
AVX2/FMA/F16C, the build fails or its self-test does, ``kernels.unavailable()`` says why and
``quantize="int4"`` is refused at load with that reason.
"""

from __future__ import annotations

import torch

from . import kernels, weight_arena
from .kernel_linear import GROUP, KernelLinear, RowReader, own_bias, row_chunks


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """``weight`` [N, K] (K a multiple of 32) in q4_0's form: (nibbles uint8 [N, K/2], scales
    float16 [N, K/32], no mins). Each group's scale is the best of a few least-squares fits
    around q4_0's own (``q4_quantize`` in the kernel)."""
    n, k = weight.shape
    w = weight.detach().float().contiguous()
    nibbles = torch.empty((n, k // 2), dtype=torch.uint8)
    scales = torch.empty((n, k // GROUP), dtype=torch.float16)
    kernels.library().q4_quantize(w.data_ptr(), n, k, nibbles.data_ptr(), scales.data_ptr())
    return nibbles, scales, None


def dequantize(nibbles: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None) -> torch.Tensor:
    """The float32 weight [N, K] that ``(nibbles, scales, mins)`` stand for (no mins: q4_0's
    form, ``(q - 8) * scale``)."""
    n = nibbles.shape[0]
    p = nibbles.reshape(n, -1, 16)
    q = torch.cat([p & 15, p >> 4], dim=-1).float()
    if mins is None:
        return ((q - 8) * scales.float().unsqueeze(-1)).reshape(n, -1)
    return (q * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1)).reshape(n, -1)


BLOCK = 16  # outputs a block of the kernel's layout


def to_blocks(rows: torch.Tensor, nibbles: bool) -> torch.Tensor:
    """A row-form array in the kernel's blocks of 16 outputs (int4.c), flat. Nibbles
    ``[N, G * 16 bytes]`` become ``[block, group, word (4), output (16), 4 bytes]``: lane o of a
    word holds output o's next four bytes of the group. Scales or mins ``[N, G]`` become
    ``[block, group, output]``. A last block's missing outputs are zero."""
    n, cols = rows.shape
    nb = -(-n // BLOCK)
    padded = rows.new_zeros((nb * BLOCK, cols))
    padded[:n] = rows
    if nibbles:
        return padded.view(nb, BLOCK, cols // 16, 4, 4).permute(0, 2, 3, 1, 4).contiguous().view(-1)
    return padded.view(nb, BLOCK, cols).permute(0, 2, 1).contiguous().view(-1)


def from_blocks(blocks: torch.Tensor, n: int, nibbles: bool) -> torch.Tensor:
    """``to_blocks``' inverse: the row form of ``n`` outputs."""
    nb = -(-n // BLOCK)
    if nibbles:
        g = blocks.numel() // (nb * BLOCK * 16)
        return blocks.view(nb, g, 4, BLOCK, 4).permute(0, 3, 1, 2, 4).reshape(nb * BLOCK, g * 16)[:n].contiguous()
    return blocks.view(nb, -1, BLOCK).permute(0, 2, 1).reshape(nb * BLOCK, -1)[:n].contiguous()


class Int4Linear(KernelLinear):
    """``y = x W^T + b`` with ``W`` in 4-bit groups of 32 (``mins`` ``None``: q4_0's form);
    float32 in and out."""

    JOINT = "q4_linears"
    BITS = 4

    def __init__(self, nibbles: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                 bias: torch.Tensor | None, *, shape: tuple[int, int] | None = None, placed: bool = False) -> None:
        """From the row form (``quantize``'s, GGUF's q4_0/q4_1): ``nibbles`` uint8 [N, K/2],
        ``scales`` (and ``mins``) float16 [N, K/32]; kept in the kernel's blocks (``to_blocks``).
        With ``shape`` ([N, K]) they are the blocks already (the weight cache keeps them so), and
        with ``placed`` in huge pages already (``weight_arena.empty``: it read them there)."""
        super().__init__()
        n, k = shape or (nibbles.shape[0], nibbles.shape[1] * 2)
        if k % GROUP:  # the kernel reads whole groups: a tail would be dropped
            raise ValueError(f"int4 takes an input width that is a multiple of {GROUP}, not {k}")
        if shape is None:
            nibbles, scales = to_blocks(nibbles, True), to_blocks(scales, False)
            mins = None if mins is None else to_blocks(mins, False)
        self._run = kernels.library().q4_linear
        self.out_features, self.in_features = n, k
        # In huge pages: every step streams them whole (weight_arena.py).
        keep = (lambda t: t) if placed else weight_arena.place
        self.register_buffer("blocks", keep(nibbles), persistent=False)
        self.register_buffer("scales", keep(scales), persistent=False)
        self.register_buffer("mins", None if mins is None else keep(mins), persistent=False)
        self.register_buffer("bias", own_bias(bias), persistent=False)
        # The kernel's weight arguments, fixed once: the buffers live on the CPU and are never
        # replaced (``_apply`` keeps ``.to()`` and ``.half()`` off them).
        self._weights = (self.blocks.data_ptr(), self.scales.data_ptr(),
                         None if self.mins is None else self.mins.data_ptr(), self.out_features,
                         None if self.bias is None else self.bias.data_ptr())

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The weights in the row form they came in: (nibbles, scales, mins)."""
        n = self.out_features
        return (from_blocks(self.blocks, n, True), from_blocks(self.scales, n, False),
                None if self.mins is None else from_blocks(self.mins, n, False))

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Int4Linear:
        return cls(*quantize(weight), bias)

    @classmethod
    def from_rows(cls, rows: RowReader, shape: tuple[int, int], bias: torch.Tensor | None) -> Int4Linear:
        """``from_weight`` of the ``[N, K]`` weight that ``rows`` gives a chunk at a time: its
        float copy is never whole (a real vocabulary's output head is 545 MB in float32 for
        Qwen2.5-0.5B, 2.1 GB for Llama-3.1-8B; its int4 is an eighth of that)."""
        n, k = shape
        nibbles = torch.empty((n, k // 2), dtype=torch.uint8)
        scales = torch.empty((n, k // GROUP), dtype=torch.float16)
        for first, stop in row_chunks(n):
            nibbles[first:stop], scales[first:stop], _ = quantize(rows(first, stop))
        return cls(nibbles, scales, None, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The per-call Python is ~8 us of a ~15 ms step's 169 calls: keep it to the call.
        if x.dtype != torch.float32 or not x.is_contiguous():
            return self.forward(x.float().contiguous()).to(x.dtype)
        y = x.new_empty((*x.shape[:-1], self.out_features))
        rows = x.numel() // self.in_features
        if rows:
            self._run(x.data_ptr(), rows, self.in_features, *self._weights, y.data_ptr())
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"
