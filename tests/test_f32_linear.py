"""float32 linears in our kernel (engine/f32_linear.py, f32_kernel.c): the blocks hold the
weights as they are, the kernel computes x W^T + b for one row and many (a part-empty last
block, any input width), into a residual, with the norm or SwiGLU on the way in, on the AVX-512
and the AVX2 paths, and a row's numbers are its own whatever its batch-mates."""

from __future__ import annotations

import pytest
import torch

from jupyter_infer.engine import layer_ops, q4_linear
from jupyter_infer.engine.cpu_features import cpu_flags
from jupyter_infer.engine.f32_linear import F32Linear, unpack

pytestmark = pytest.mark.skipif(q4_linear.unavailable() is not None, reason="no kernel library on this machine")


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_the_blocks_hold_the_weights_as_they_are() -> None:
    w = torch.randn(37, 50)  # 37 outputs: the last block of 16 is part-empty
    layer = F32Linear(w, None)
    assert torch.equal(unpack(layer.packed, 37), w)
    assert layer.packed.shape == (3, 50, 16) and not layer.packed[2, :, 5:].any()


@pytest.mark.parametrize("k", [50, 896])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_the_kernel_computes_x_w_plus_b(k: int, rows: int) -> None:
    torch.manual_seed(k + rows)
    w, b = torch.randn(37, k), torch.randn(37)
    layer, x = F32Linear(w, b), torch.randn(rows, k)
    _close(layer(x), x.double() @ w.double().t() + b.double())
    for i in range(rows):  # a row's numbers are its own
        assert torch.equal(layer(x[i : i + 1])[0], layer(x)[i])
    assert layer(x.bfloat16()).dtype == torch.bfloat16  # another dtype goes in and comes out as itself


def test_a_joint_call_adds_into_a_residual_with_the_norm_or_swiglu_on_the_way_in() -> None:
    torch.manual_seed(1)
    q, k = F32Linear(torch.randn(48, 64), None), F32Linear(torch.randn(16, 64), torch.randn(16))
    joint = q4_linear.Int4Linears([q, k])
    x, weight = torch.randn(5, 64), torch.rand(64) + 0.5
    assert torch.equal(joint(x), torch.cat([q(x), k(x)], dim=-1))
    assert torch.equal(joint(x, norm=(weight, 1e-6)), joint(layer_ops.rms_norm(x, weight, 1e-6)))
    residual = torch.randn(5, 64)
    assert torch.equal(joint(x, into=residual.clone()), residual + joint(x))
    gate_up = torch.randn(5, 128)
    assert torch.equal(q4_linear.Int4Linears([q])(gate_up, gated=True), q(layer_ops.swiglu(gate_up)))


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU runs the AVX2 path already")
@pytest.mark.parametrize("rows", [1, 4, 5, 9])
def test_the_avx2_path_computes_the_same_on_an_avx512_machine(rows: int) -> None:
    narrow = q4_linear._library(("-mno-avx512f",))
    assert not isinstance(narrow, str), narrow
    torch.manual_seed(rows)
    w, b = torch.randn(40, 192), torch.randn(40)
    layer, x, y = F32Linear(w, b), torch.randn(rows, 192), torch.empty(rows, 40)
    narrow.f32_linears(x.data_ptr(), rows, 192, *layer._joint._args, y.data_ptr(), 0, None, 0.0, 0)
    _close(y, x.double() @ w.double().t() + b.double())
