"""The decoder's small ops in C for the int4 path (``csrc/layer_ops.c``, in our CPU kernel library):
RMSNorm and SwiGLU as ``JointLinears`` applies them on a row's way in (here alone, for tests),
RoPE in place to the bit, and attention for a decode step. Each replaces several torch ops of a
few microseconds' dispatch each on a few thousand floats (docs/engine.md, "The decoder's small
ops in C")."""

from __future__ import annotations

import torch

from .kernels import library


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm ``JointLinears(..., norm=(weight, eps))`` applies to its input, alone (float32
    ``x [..., K]``): torch's arithmetic but for the order of the sum of squares."""
    x, weight = x.float().contiguous(), weight.float().contiguous()
    y = torch.empty_like(x)
    k = x.shape[-1]
    library().ji_rms_norm(x.data_ptr(), x.numel() // k, k, weight.data_ptr(), eps, y.data_ptr())
    return y


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x = [..., gate | up]`` as ``JointLinears(..., gated=True)`` reads
    it, alone (float32): torch's arithmetic but for its exp's last bits."""
    x = x.float().contiguous()
    k = x.shape[-1] // 2
    y = x.new_empty((*x.shape[:-1], k))
    library().ji_swiglu(x.data_ptr(), x.numel() // (2 * k), k, y.data_ptr())
    return y


def rope_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate the first ``heads`` heads of ``x`` (``[1, T, all heads, dim]``, float32,
    contiguous) in place as transformers' ``apply_rotary_pos_emb`` does, to the bit; ``cos``
    and ``sin`` ``[1, T, dim]``. The int4 decode path's RoPE (``llama_forward.py``)."""
    if x.dtype != torch.float32 or not x.is_contiguous():  # the kernel writes x as one array
        raise ValueError("rope_ rotates a contiguous float32 tensor only")
    _, tokens, stride_heads, dim = x.shape
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    library().ji_rope(x.data_ptr(), tokens, heads, stride_heads * dim, dim, cos.data_ptr(), sin.data_ptr())


def head_norm_(x: torch.Tensor, first: int, heads: int, weight: torch.Tensor, eps: float) -> None:
    """RMSNorm in place over heads ``first .. first + heads - 1`` of ``x`` (``[1, T, all heads,
    dim]``, float32, contiguous), each head on its own with ``weight [dim]``: Qwen3's q_norm and
    k_norm, as ``rms_norm`` computes a row."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("head_norm_ normalizes a contiguous float32 tensor only")
    _, tokens, stride_heads, dim = x.shape
    weight = weight.float().contiguous()
    library().ji_head_norm(x.data_ptr(), tokens, stride_heads * dim, first, heads, dim, weight.data_ptr(), eps)


def _check_layouts(who: str, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """What the attention kernels read as raw memory: float32 keys and values of one layout, a
    column ``dim`` floats on, and a float32 query with its heads side by side."""
    dim = q.shape[-1]
    for t in (keys, values):
        if t.dtype != torch.float32 or t.stride(-1) != 1 or t.stride(-2) != dim or t.stride() != keys.stride():
            raise ValueError(f"{who} reads keys and values of one layout, a column dim floats on")
    if q.dtype != torch.float32 or q.stride(-1) != 1 or q.stride(-2) != dim:
        raise ValueError(f"{who} reads a float32 query, its heads side by side")


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """Decode attention, one new token a row: ``q`` ``[rows, heads, dim]`` (a row's heads side by
    side; rows any stride), ``keys`` and ``values`` ``[rows, kv heads, columns, dim]`` (a cache
    buffer's view: columns ``dim`` apart), ``keep`` ``[rows, columns]`` uint8 (0: a column the
    row does not see; ``None``: every one). Returns ``[rows, heads, dim]``: SDPA's result but for
    its order of sums. float32."""
    rows, heads, dim = q.shape
    columns = keys.shape[2]
    if keys.shape[0] != rows or keys.shape[3] != dim or values.shape != keys.shape or heads % keys.shape[1]:
        raise ValueError("attend's keys and values are [rows, kv heads, columns, dim] of the query's rows and dim")
    _check_layouts("attend", q, keys, values)
    if keep is not None and (keep.dtype != torch.uint8 or keep.shape != (rows, columns) or not keep.is_contiguous()):
        raise ValueError("attend's keep is a contiguous uint8 [rows, columns]")
    out = q.new_empty((rows, heads, dim))
    library().ji_attend_decode(q.data_ptr(), rows, heads, keys.shape[1], dim, q.stride(0), keys.data_ptr(),
                        values.data_ptr(), keys.stride(0), keys.stride(1), columns,
                        None if keep is None else keep.data_ptr(), scale, out.data_ptr())
    return out


def attend_prompt(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                  precise: bool = False) -> torch.Tensor | None:
    """A prompt's causal attention (``csrc/attention.c``): ``q`` ``[T, heads, dim]`` (tokens
    any stride, heads side by side), ``keys`` and ``values`` ``[kv heads, L, dim]`` (a cache
    buffer's view, a column ``dim`` floats on), the queries being the last ``T`` of the ``L``
    positions. Products in bfloat16 where the build has the bfloat16 dot and ``dim`` is a
    multiple of 64, else (or ``precise``) in float32 (``csrc/attention_f32.c``, AVX2). Returns
    ``[T, heads, dim]`` float32, or ``None`` where ``dim`` is not a multiple of 16 (SDPA serves)."""
    tokens, heads, dim = q.shape
    kv_heads, columns = keys.shape[0], keys.shape[1]
    if keys.shape[2] != dim or values.shape != keys.shape or heads % kv_heads or tokens > columns:
        raise ValueError("attend_prompt's keys and values are [kv heads, columns, dim], as many columns as queries or more")
    _check_layouts("attend_prompt", q, keys, values)
    out = q.new_empty((tokens, heads, dim))
    lib = library()
    attend = lib.ji_attend_prompt_f32 if precise else lib.ji_attend_prompt
    done = attend(q.data_ptr(), tokens, heads, q.stride(0), keys.data_ptr(), values.data_ptr(),
                  kv_heads, keys.stride(0), columns, dim, scale, out.data_ptr())
    return out if done == 0 else None
