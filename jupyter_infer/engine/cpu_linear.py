"""Faster linear layers on the CPU, swapped into an unchanged transformers model at load.

A decode step on the CPU is ~80 % ``aten::addmm`` (docs/engine.md), and eager PyTorch hands
every call MKL's row-major weight: a few rows per step barely use the cores, and the whole
weight is re-read in a layout the kernel must re-block. Two swaps, both measured on the
"small" GPT-2-shaped model (docs/benchmark.md, "CPU kernels"):

* **prepacked** (the default on a CPU): each weight is reordered once into oneDNN's blocked
  layout, the same ``mkldnn._linear_pointwise`` that inductor's ``freezing`` emits. Same dtype,
  same math, sums in another order: 1.4x tokens/s alone and 2x at 16 rows in float32.
* **int8** (weight-only, per output channel, the counterpart of llama.cpp's q8_0): a quarter of
  float32's weight bytes, which is what a decode step is bound by. Its kernel
  (``_weight_int8pack_mm``) is fast only with bfloat16 activations, so it needs a CPU with
  native bf16; for many rows at once (a prefill) the weight is dequantized instead, because the
  int8 kernel is slower than a bf16 GEMM there.

Only the linears change: attention, norms, embeddings and the cache classes stay the
model's own, so every architecture transformers loads keeps working; a linear of another kind
(a LoRA wrapper, a quantized module) is left as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

# Rows at or above which Int8Linear dequantizes and runs a bf16 GEMM: the int8 kernel's time
# grows with rows, a dequantize is paid once per call (measured crossover ~32 rows).
INT8_GEMM_ROWS = 32
QUANTIZE = ("none", "int8")


@dataclass(frozen=True)
class LinearReport:
    kernels: str  # what the linears run on, for status and the bench
    layers: int  # linears swapped
    seconds: float  # time spent packing or quantizing, paid once at load


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` reordered once for oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # No batch-size hint: one packing serves a 1-row decode and a 1000-row prefill.
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight.contiguous()), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn prepacked"


class Int8Linear(nn.Module):
    """Weight-only int8: symmetric, one scale per output channel; activations in bf16."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        w = weight.float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(),
                             persistent=False)
        self.register_buffer("scale", scale.to(torch.bfloat16), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, shape = x.dtype, x.shape
        rows = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if rows.shape[0] >= INT8_GEMM_ROWS:
            y = nn.functional.linear(rows, self.qweight.to(torch.bfloat16) * self.scale[:, None], self.bias)
        else:
            y = torch._weight_int8pack_mm(rows, self.qweight, self.scale)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only"


def swap_linears(model: nn.Module, *, prepack: bool, quantize: str = "none") -> LinearReport:
    """Replace ``model``'s linears in place (CPU only); say what they run on now."""
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    dtype = next(model.parameters()).dtype
    if quantize == "int8":
        make = Int8Linear
        kernels = "int8 weight-only (per channel), bf16 activations"
    elif prepack and onednn_available() and dtype in (torch.float32, torch.bfloat16):
        make = PackedLinear
        kernels = f"onednn prepacked {str(dtype).removeprefix('torch.')}"
    else:
        return LinearReport(kernels="eager (aten addmm)", layers=0, seconds=0.0)
    start = time.perf_counter()
    swapped = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    weight, bias = child.weight, child.bias
                elif type(child) is Conv1D:  # GPT-2's linears keep the weight as [in, out]
                    weight, bias = child.weight.t(), child.bias
                else:
                    continue
                setattr(parent, name, make(weight.detach(), None if bias is None else bias.detach()))
                swapped += 1
    return LinearReport(kernels=kernels, layers=swapped, seconds=time.perf_counter() - start)
