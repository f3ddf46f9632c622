"""Faster linear layers on the CPU, swapped into an unchanged transformers model at load.

A decode step on the CPU is ~80 % linear layers (torch.profiler), and at a few rows a step is
bound by reading their weights. Two swaps, measured on the "small" GPT-2-shaped model
(docs/engine.md, "CPU linears"):

* **prepacked** (the default on a CPU): each weight is reordered once into a blocked layout.
  float32 and bfloat16 run in our own kernel (``float_linear.py``: blocks of 16 outputs, read at
  the memory's speed at one row) where the int4 library builds; where it does not, in oneDNN's
  layout, the same ``mkldnn._linear_pointwise`` that inductor's ``freezing`` emits.
  Same dtype, same math, sums in another order: oneDNN's gave 1.4x tokens/s alone and 2x at 16
  rows in float32 over eager.
* **int4** (``int4_linear.py``, the counterpart of llama.cpp's q4_0): 4-bit weights in groups
  of 32 with a float16 scale, multiplied by int8 activations in our own AVX2 kernel.
* **int8** (``int8_linear.py``, llama.cpp's q8_0): int8 weights in groups of 32 with a float16
  scale, multiplied by int8 activations in our own kernel, in blocks of 16 outputs. Where the
  int4 library cannot build, fbgemm's dynamic int8 (one scale per output channel, activations
  quantized per call with one scale shared by the step's rows) serves instead.

Only the linears change: attention, norms, embeddings and the cache classes stay the
model's own, so every architecture transformers loads keeps working; a linear of another kind
(a LoRA wrapper, a quantized module) is left as it is. A tied output head (GPT-2's) gets its
own packed copy of the embedding matrix, the step's largest GEMV; where it is our float or int8
kernel's, the embedding's lookups read that copy and the float table goes
(``float_embedding``, ``int8_embedding``).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..values import load_progress
from ..values.config import QUANTIZE
from . import kernels
from .features import cpu_has_vnni
from .float_linear import BF16Linear, F32Linear
from .int4_linear import Int4Linear
from .int8_linear import Q8Linear
from .kernel_linear import GROUP, RowReader


@dataclass(frozen=True)
class LinearReport:
    kernels: str  # what the linears run on, for status and the bench
    layers: int  # linears swapped
    seconds: float  # time spent packing or quantizing, paid once at load
    cache: dict | None = None  # the weight cache this load used or wrote (formats/weight_cache.py)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def onednn_refuses(dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot prepack weights of ``dtype`` on this CPU (``None``: it can). Its bf16
    path needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT, which an AVX2-only CPU lacks."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros((16, 16), dtype=dtype))
    except RuntimeError as err:
        return str(err).strip().splitlines()[0][:200]
    return None


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
    """int8 weights (symmetric, one scale per output channel) times int8 activations (one
    scale per call, found on the fly): fbgemm's dynamic quantized linear, VNNI where the CPU
    has it. Output in the input's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        w = weight.float()
        scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).double()
        with warnings.catch_warnings():
            # PyTorch 2.13 deprecates quantized tensors (its issue 184982) without a CPU
            # replacement yet; int8_available() refuses int8 once they are gone.
            warnings.filterwarnings("ignore", "torch.quantize_per", UserWarning)
            q = torch.quantize_per_channel(w, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(q, None if bias is None else bias.float())
        self.has_bias = bias is not None  # inside the pack, where parameter_count cannot see it
        self.reduce_range = not cpu_has_vnni()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x.float(), self.packed, self.reduce_range)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 dynamic"


def fbgemm_available() -> bool:
    """PyTorch's x86 quantized kernels (fbgemm) are in this build and run on this CPU."""
    return (hasattr(torch, "quantize_per_channel") and hasattr(torch.ops.quantized, "linear_dynamic")
            and any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm")))


def int8_available() -> bool:
    """int8 runs here: in our kernel (int8_linear.py, where the int4 library builds) or fbgemm's."""
    return kernels.unavailable() is None or fbgemm_available()


INT4_KERNELS = "int4 (ours, int4.c): groups of 32 with a float16 scale (q4_0's form), int8 activations per group"
Q8_KERNELS = "int8 (ours, int8.c): groups of 32 with a float16 scale (q8_0's form), int8 activations per group"
F32_KERNELS = "float32 (ours, float.c): blocks of 16 outputs, k-major"
BF16_KERNELS = "bfloat16 (ours, float.c): blocks of 16 outputs in input pairs"
FBGEMM_KERNELS = "int8 dynamic (fbgemm): int8 weights per channel, int8 activations per call"


class _Formats(Mapping):
    """quantize -> (what builds a linear from a weight and a bias, what status says it runs on).
    int8 is ours where the int4 library builds (q8_0's form), else fbgemm's: decided when asked,
    so that importing this module builds nothing."""

    def __getitem__(self, quantize: str) -> tuple[Callable[..., nn.Module], str]:
        if quantize == "int4":
            return Int4Linear.from_weight, INT4_KERNELS
        if quantize == "int8":
            return (Q8Linear.from_weight, Q8_KERNELS) if kernels.unavailable() is None else (Int8Linear, FBGEMM_KERNELS)
        raise KeyError(quantize)

    def __iter__(self) -> Iterator[str]:
        return iter(("int8", "int4"))

    def __len__(self) -> int:
        return 2


QUANTIZED = _Formats()


def from_rows(quantize: str) -> Callable[[RowReader, tuple[int, int], torch.Tensor | None], nn.Module] | None:
    """What builds a linear in ``quantize``'s format from its weight's rows, a chunk at a time
    (``Int4Linear.from_rows``); None where the format takes the whole weight at once (float,
    fbgemm's int8)."""
    if quantize not in QUANTIZED:
        return None
    make = QUANTIZED[quantize][0]
    return {Int4Linear.from_weight: Int4Linear.from_rows, Q8Linear.from_weight: Q8Linear.from_rows}.get(make)


# Our kernels' linears (int4 in q4_0's form, int8 in q8_0's, float32 and bfloat16 in blocks): a
# joint of one kind is one kernel call (``JointLinears``); the checkpoint loader leaves their
# buffers alone (the kernels hold their addresses).
OURS = (Int4Linear, Q8Linear, F32Linear, BF16Linear)
OURS_QUANTIZED = (Int4Linear, Q8Linear)  # beside these the input embedding is int8 too (int8_embedding.py)


def quantized_by_us(model: nn.Module) -> bool:
    """Whether ``model``'s linears are our int4 or int8 (its input embedding then goes int8 too)."""
    return any(isinstance(m, OURS_QUANTIZED) for m in model.modules())


def swappable(quantize: str, in_features: int) -> bool:
    """Whether a linear of this input width takes ``quantize``'s format (our int4 and int8 need
    whole groups of 32; a linear that does not stays the model's own)."""
    if quantize == "none" or in_features % GROUP == 0:
        return True
    return quantize == "int8" and QUANTIZED["int8"][0] is Int8Linear


def float_linears(dtype: torch.dtype, prepack: bool) -> tuple[type[nn.Module] | None, str]:
    """What builds this machine's float linears of ``dtype`` (None: the model's own stay) and
    what status says they run on: float32 and bfloat16 in our kernel where the int4 library
    builds, else oneDNN's prepacked weights."""
    ours = {torch.float32: (F32Linear, F32_KERNELS), torch.bfloat16: (BF16Linear, BF16_KERNELS)}.get(dtype)
    if prepack and ours and kernels.unavailable() is None:
        return ours
    if not (prepack and onednn_available() and dtype in (torch.float32, torch.bfloat16)):
        return None, "eager (aten addmm)"
    refused = onednn_refuses(dtype)
    if refused:  # e.g. bfloat16 on a CPU without AVX-512 BW/VL/DQ: the model's own linears work
        return None, f"eager (aten addmm): oneDNN cannot prepack here ({refused})"
    return PackedLinear, f"onednn prepacked {str(dtype).removeprefix('torch.')}"


def swap_linears(model: nn.Module, *, prepack: bool, quantize: str = "none") -> LinearReport:
    """Replace ``model``'s linears in place (CPU only); say what they run on now."""
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    dtype = next(model.parameters()).dtype
    if quantize in QUANTIZED:
        make, kernels = QUANTIZED[quantize]
    else:
        make, kernels = float_linears(dtype, prepack)
        if make is None:
            return LinearReport(kernels=kernels, layers=0, seconds=0.0)
    start = time.perf_counter()
    swapped = 0
    progress = load_progress.current()
    progress.phase(f"{'quantizing' if quantize in QUANTIZED else 'packing'} the linears",
                   sum(type(m) in (nn.Linear, Conv1D) for m in model.modules()), "linears")
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) in (nn.Linear, Conv1D):
                    progress.advance()
                if type(child) is nn.Linear:
                    weight, bias = child.weight, child.bias
                elif type(child) is Conv1D:  # GPT-2's linears keep the weight as [in, out]
                    weight, bias = child.weight.t(), child.bias
                else:
                    continue
                if not swappable(quantize, weight.shape[1]):
                    continue
                setattr(parent, name, make(weight.detach(), None if bias is None else bias.detach()))
                swapped += 1
    return LinearReport(kernels=kernels, layers=swapped, seconds=time.perf_counter() - start)
