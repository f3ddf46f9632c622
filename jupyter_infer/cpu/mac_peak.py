"""The machine's multiply-add peak and our linears' share of it, measured (issue 49).

``peak_gmacs`` times the kernel library's ``ji_peak`` (``csrc/peak.c``: independent chains of
the widest dot instruction the build has, on every OpenMP thread) and ``linear_gmacs`` times
our linears over the shapes of a decoder layer at a row count. The bench prints both, and
their ratio, so "near the peak" is a measured share on the machine it ran on, not a datasheet
figure. Both need the kernel library (``kernels.unavailable()`` says why not).
"""

from __future__ import annotations

import time

import torch

from . import kernels
from .float_linear import BF16Linear, F32Linear
from .model_linears import QUANTIZED

KINDS = {"int8": 0, "bfloat16": 1, "float32": 2}
# A decoder layer of Qwen2.5-0.5B's shape, as our joint calls run it: q/k/v, o, gate/up, down.
LAYER_SHAPES = ((1152, 896), (896, 896), (9728, 896), (896, 4864))


def peak_gmacs(kind: str, seconds: float = 0.2) -> float:
    """Billions of multiply-adds a second at ``kind``'s peak on torch's thread count (the best
    of three runs of about ``seconds`` each)."""
    lib = kernels.library()
    code = KINDS[kind]
    iters = 10_000
    while True:  # grow the run until it is long enough to time
        start = time.perf_counter()
        lib.ji_peak(code, iters)
        took = time.perf_counter() - start
        if took >= seconds / 4:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / took))
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        macs = lib.ji_peak(code, iters)
        best = max(best, macs / (time.perf_counter() - start) / 1e9)
    return best


def _linear(kind: str, weight: torch.Tensor) -> torch.nn.Module:
    if kind in QUANTIZED:  # int4, int8: as a quantized model's loader builds them
        return QUANTIZED[kind][0](weight, None)
    return BF16Linear(weight, None) if kind == "bfloat16" else F32Linear(weight, None)


def linear_gmacs(kind: str, rows: int, shapes: tuple[tuple[int, int], ...] = LAYER_SHAPES,
                 repeats: int = 3) -> float:
    """Billions of multiply-adds a second of our ``kind`` linears ("int4", "int8", "bfloat16",
    "float32") over ``shapes`` (outputs, inputs) at ``rows`` rows: the best of ``repeats``."""
    gen = torch.Generator().manual_seed(0)
    linears = [_linear(kind, torch.randn(n, k, generator=gen) * 0.02) for n, k in shapes]
    inputs = [torch.randn(rows, k, generator=gen) for _, k in shapes]
    macs = rows * sum(n * k for n, k in shapes)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            for linear, x in zip(linears, inputs, strict=True):
                linear(x)
            best = min(best, time.perf_counter() - start)
    return macs / best / 1e9


# A prompt's attention in Qwen2.5-0.5B's shape: query heads, key/value heads, head dim.
ATTENTION_SHAPE = (14, 2, 64)
ATTENTION_PATHS = ("ours", "ours_f32", "sdpa")


def attention_gmacs(path: str, tokens: int, shape: tuple[int, int, int] = ATTENTION_SHAPE, repeats: int = 3) -> float:
    """Billions of multiply-adds a second of a fresh ``tokens``-token prompt's causal attention
    (q.k and p.v, over the visible keys only): ``path`` "ours" (``layer_ops.attend_prompt``:
    the bfloat16 dot where the build has it), "ours_f32" (its float32 AVX2 kernel) or "sdpa"
    (torch's)."""
    import torch.nn.functional as F

    from . import layer_ops

    heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, heads, dim, generator=gen)
    k, v = (torch.randn(kv_heads, tokens, dim, generator=gen) for _ in range(2))
    run = {
        "ours": lambda: layer_ops.attend_prompt(q, k, v, dim**-0.5),
        "ours_f32": lambda: layer_ops.attend_prompt(q, k, v, dim**-0.5, precise=True),
        "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], is_causal=True,
                                                       scale=dim**-0.5, enable_gqa=True),
    }[path]
    macs = heads * dim * 2 * tokens * (tokens + 1) / 2
    best = float("inf")
    with torch.inference_mode():
        run()  # warm
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    return macs / best / 1e9
