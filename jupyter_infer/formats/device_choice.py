"""Where a Hugging Face model runs and in what precision: the device (CUDA, MPS, the CPU), the
dtype it picks there, the weight formats this machine has fast kernels for, the CPU threads."""

from __future__ import annotations

import os

import torch

from ..cpu import kernels
from ..cpu.features import cpu_flags
from ..cpu.model_linears import QUANTIZE, int8_available

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str = "auto") -> str:
    """CUDA, then Apple's MPS, then the CPU."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
        return DTYPES[dtype]
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    # On a CPU, bfloat16 halves the weight bytes a decode step reads, and CPUs with native
    # bf16 instructions turn that into ~2x tokens/s (docs/benchmark.md); without them it is
    # emulated and slower than float32.
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX (Linux's /proc/cpuinfo flags)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def check_quantize(quantize: str, device: str) -> None:
    """Refuse a weight format this machine has no fast kernel for, saying why."""
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    if device != "cpu":
        raise ValueError(f"quantize={quantize!r} is a CPU weight format; on {device} load the model in "
                         "bfloat16/float16 (dtype) instead.")
    if quantize == "int8" and not int8_available():
        raise ValueError(f"quantize={quantize!r} needs our int8 kernel ({kernels.unavailable()}) or PyTorch's "
                         "x86 quantized kernels (fbgemm), which this build or CPU lacks.")
    if quantize == "int4" and (why := kernels.unavailable()):
        raise ValueError(f"quantize='int4' cannot run here: {why}.")


def default_num_threads() -> int:
    """All the cores this process may use on a small machine (its CPU affinity: a container or
    ``taskset`` may give it fewer than the machine has); leave two for kernels and the server on
    a big one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if cores <= 4 else cores - 2
