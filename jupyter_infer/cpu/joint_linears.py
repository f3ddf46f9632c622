"""Several of our linears over one input as one kernel call: q, k and v, or gate and up.

A joint is one kind of ``KernelLinear`` (int4, int8, float32 or bfloat16 blocks): its kernel
(``q4_linears``, ``q8_linears``, ``f32_linears``, ``bf16_linears``) reads the input once (int8
quantization included) and one parallel loop covers every output. The same joints, as
``joint_args`` structs, are what a decode step's one C call runs (``decode_layers``).
"""

from __future__ import annotations

import ctypes

import torch

from . import kernels
from .kernel_linear import KernelLinear


class JointLinears:
    """Several ``KernelLinear``s of one kind over one input as one kernel call, outputs side by
    side in ``[..., sum of out_features]``. ``into`` with ``accumulate`` adds the result to a
    tensor (a residual) instead of allocating one. The linears keep their weights: nothing is
    copied."""

    MAX = 8  # what the kernel's bookkeeping holds

    def __init__(self, linears: list[KernelLinear]) -> None:
        if (not 1 <= len(linears) <= self.MAX or len({lin.in_features for lin in linears}) != 1
                or len({type(lin) for lin in linears}) != 1):
            raise ValueError("JointLinears takes 1 to 8 linears of one kind and one input width")
        self.kind = type(linears[0])
        self._run = getattr(kernels.library(), linears[0].JOINT)
        self.linears = linears  # keeps the weights alive while their addresses are held
        self.in_features = linears[0].in_features
        self.out_features = sum(lin.out_features for lin in linears)
        n = len(linears)

        def array(values: list[int | None]) -> ctypes.Array:
            return (ctypes.c_void_p * n)(*values)

        weights = [lin._weights for lin in linears]
        # The kernel's nw, qw[], scales[], mins[], N[], bias[] (kernels._JOINT), built once: a
        # call passes them as they are.
        self.weight_args = (n, array([w[0] for w in weights]), array([w[1] for w in weights]),
                            array([w[2] for w in weights]), (ctypes.c_int * n)(*[w[3] for w in weights]),
                            array([w[4] for w in weights]))

    def joint_args(self) -> kernels.JointArgs:
        """This joint as the ``joint_args`` a C caller takes (``ji_decode_layers``). It points at
        this object's arrays: keep the object alive while the struct is used."""
        n, *arrays = self.weight_args
        return kernels.JointArgs(self.kind.BITS, n, *(ctypes.cast(a, ctypes.c_void_p) for a in arrays))

    def __call__(self, x: torch.Tensor, into: torch.Tensor | None = None,
                 norm: tuple[torch.Tensor, float] | None = None, gated: bool = False) -> torch.Tensor:
        """``x @ [W1; W2; ...]^T`` (float32 ``x``); with ``into`` (float32, contiguous, the
        output's shape) added to it in place and returned. ``norm`` (float32 weight [K], eps):
        ``x`` RMS-normalized per row first, in the same call (``rms_norm(x) * weight``, each row
        on its own; the sum of squares in the kernel's order, not torch's). ``gated``: ``x`` is
        ``[..., gate | up]`` (twice the input width) and the linears read ``swiglu(x)``."""
        if x.dtype != torch.float32 or not x.is_contiguous():  # the kernel reads x as one array
            x = x.float().contiguous()
        if into is not None and (into.dtype != torch.float32 or not into.is_contiguous()):
            raise ValueError("JointLinears adds into a contiguous float32 tensor only")
        if norm is not None and gated:
            raise ValueError("JointLinears takes a norm or SwiGLU on the way in, not both")
        weight, eps = norm if norm is not None else (None, 0.0)
        if weight is not None and (weight.dtype != torch.float32 or not weight.is_contiguous()
                                   or weight.numel() != self.in_features):
            raise ValueError("JointLinears normalizes with a contiguous float32 weight of its input's width")
        if x.shape[-1] != self.in_features * (2 if gated else 1):
            raise ValueError(f"JointLinears takes {self.in_features * (2 if gated else 1)} input columns, not {x.shape[-1]}")
        rows = x.numel() // x.shape[-1]
        if into is not None and into.numel() != rows * self.out_features:  # the kernel writes raw memory
            raise ValueError(f"JointLinears adds into {rows} rows of {self.out_features} columns")
        y = x.new_empty((*x.shape[:-1], self.out_features)) if into is None else into
        if rows:
            self._run(x.data_ptr(), rows, self.in_features, *self.weight_args, y.data_ptr(), into is not None,
                      None if weight is None else weight.data_ptr(), eps, gated)
        return y
