"""The CPU kernel library's one typed facade: every C entry point of ``csrc/kernels.h``
declared once, by the name it has in C, as are the structs it takes by address (``JointArgs``,
``LayerArgs``); and the one place that says whether the library can run here
(``unavailable``) and what it is (``status``).

Every module that computes with our kernels (int4, int8, float32/bfloat16 linears, the
decoder's small ops, a decode step's layers) calls ``library()`` here; ``build.py`` compiles
and probes it. Loaded with ``ctypes``, which lets go of the GIL while a kernel runs.
"""

from __future__ import annotations

import ctypes
import functools

from . import build

_ptr, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
# A joint of linears (q/k/v, gate/up): x, M, K, nw, qw[], scales[], mins[], N[], bias[], y,
# accumulate, norm, eps, gated.
_JOINT = [_ptr, _i32, _i32, _i32, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i32, _ptr, _f32, _i32]
SIGNATURES: dict[str, list] = {
    "q4_linears": _JOINT,
    "q8_linears": _JOINT,
    "f32_linears": _JOINT,
    "bf16_linears": _JOINT,
    "q4_linear": [_ptr, _i32, _i32, _ptr, _ptr, _ptr, _i32, _ptr, _ptr],  # x, M, K, qw, scales, mins, N, bias, y
    "q4_quantize": [_ptr, _i32, _i32, _ptr, _ptr],  # w, N, K, nibbles, scales
    "q8_quantize": [_ptr, _i32, _i32, _ptr, _ptr],  # w, N, K, blocks, scales
    "ji_rms_norm": [_ptr, _i32, _i32, _ptr, _f32, _ptr],  # x, M, K, w, eps, y
    "ji_swiglu": [_ptr, _i32, _i32, _ptr],  # x, M, K, y
    "ji_head_norm": [_ptr, _i32, _i32, _i32, _i32, _i32, _ptr, _f32],  # x, T, stride, first, heads, D, w, eps
    "ji_rope": [_ptr, _i32, _i32, _i32, _i32, _ptr, _ptr],  # x, T, heads, stride, D, cos, sin
    # q, rows, heads, kv_heads, D, q_stride, k, v, kv_row, kv_head, columns, mask, scale, out
    "ji_attend_decode": [_ptr, _i32, _i32, _i32, _i32, _i64, _ptr, _ptr, _i64, _i64, _i32, _ptr, _f32, _ptr],
    # q, T, heads, q_row, k, v, kv_heads, kv_head, L, D, scale, out
    "ji_attend_prompt": [_ptr, _i32, _i32, _i64, _ptr, _ptr, _i32, _i64, _i32, _i32, _f32, _ptr],
    "ji_attend_prompt_f32": [_ptr, _i32, _i32, _i64, _ptr, _ptr, _i32, _i64, _i32, _i32, _f32, _ptr],
    # n_layers, layers, rows, hidden, heads, kv_heads, D, intermediate, h, cos, sin, column, mask, scale
    "ji_decode_layers": [_i32, _ptr, *[_i32] * 6, _ptr, _ptr, _ptr, _i32, _ptr, _f32],
    "ji_probe": [],
    "ji_peak": [_i32, _i64],  # kind (0 int8, 1 bfloat16, 2 float32), iterations a thread
}

RETURNS = {"ji_probe": _i32, "ji_peak": ctypes.c_double, "ji_attend_prompt": _i32,
           "ji_attend_prompt_f32": _i32}  # the rest return nothing


class JointArgs(ctypes.Structure):
    """``joint_args``: linears over one input, as ``_JOINT``'s nw .. bias, and the bits that
    say which ``*_linears`` takes them (4, 8, 16 bfloat16, 32 float32)."""

    _fields_ = [("bits", _i32), ("nw", _i32), ("qw", _ptr), ("scales", _ptr), ("mins", _ptr), ("N", _ptr),
                ("bias", _ptr)]


class LayerArgs(ctypes.Structure):
    """``layer_args``: one decoder layer's linears and norms, and (per step) its cache buffers,
    for ``ji_decode_layers``."""

    _fields_ = [("qkv", JointArgs), ("o", JointArgs), ("gate_up", JointArgs), ("down", JointArgs),
                ("input_norm", _ptr), ("post_norm", _ptr), ("q_norm", _ptr), ("k_norm", _ptr),
                ("input_eps", _f32), ("post_eps", _f32), ("head_eps", _f32),
                ("keys", _ptr), ("values", _ptr),
                ("kv_row", _i64), ("kv_head", _i64)]


@functools.cache
def load(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | str:
    """The library, built, probed and declared; or why there is none."""
    built = build.build(extra_flags)
    if isinstance(built, str):
        return built
    # torch is imported, so its OpenMP runtime (libgomp.so.1) is the one the library binds to.
    lib = ctypes.CDLL(str(built))
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, RETURNS.get(name)
    return lib


def library() -> ctypes.CDLL:
    """The loaded library; raises with the reason where there is none."""
    lib = load()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    return lib


def unavailable() -> str | None:
    """Why our kernels (int4, int8, float32/bfloat16) cannot run here (``None``: they can).
    Builds and probes the library once."""
    lib = load()
    return lib if isinstance(lib, str) else None


def status() -> str:
    """What ``infer/status`` says of them: ready, why not, or not needed so far. It never
    builds the library itself: a model whose layers do not use it costs no compile and no
    probe for the sake of a status line."""
    if load.cache_info().currsize == 0:
        return "not loaded: nothing this process runs has needed them"
    why = unavailable()
    return "ours, built for this CPU; self-test passed" if why is None else f"not used: {why}"
