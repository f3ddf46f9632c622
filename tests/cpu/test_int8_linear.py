"""int8 in q8_0's form (cpu/int8_linear.py, int8.c): the weights are q8_0's rounding in
blocks of 16 outputs, the kernel computes what they say for one row and many, into a residual,
with the norm or SwiGLU on the way in, on the AVX-512 and the AVX2 paths, and a row's numbers
are its own whatever its batch-mates."""

from __future__ import annotations

import ctypes

import pytest
import torch

from jupyter_infer.cpu import int4_linear, kernels, layer_ops
from jupyter_infer.cpu.features import cpu_flags
from jupyter_infer.cpu.int8_linear import Q8Linear, dequantize
from jupyter_infer.cpu.joint_linears import JointLinears

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason="no kernel library on this machine")


def reference(x: torch.Tensor, layer: Q8Linear) -> torch.Tensor:
    """The kernel's arithmetic in float64: activations rounded to int8 per group of 32."""
    w = dequantize(layer.packed, layer.scales, layer.out_features, layer.in_features).double()
    xg = x.double().reshape(x.shape[0], -1, 32)
    d = xg.abs().amax(-1, keepdim=True).float().double() / 127
    xq = torch.where(d > 0, (xg / d).round(), torch.zeros_like(xg)) * d
    y = xq.reshape(x.shape) @ w.t()
    return y if layer.bias is None else y + layer.bias.double()


def test_the_weights_are_q8_0s_rounding() -> None:
    torch.manual_seed(0)
    w = torch.randn(37, 96) * torch.rand(37, 1) * 3  # 37 outputs: the last block of 16 is part-empty
    layer = Q8Linear.from_weight(w, None)
    got = dequantize(layer.packed, layer.scales, 37, 96)
    scale = (w.reshape(37, 3, 32).abs().amax(-1) / 127).half().float()  # q8_0: max / 127, float16
    assert torch.equal(layer.scales.view(3, 3, 16).permute(0, 2, 1).reshape(48, 3)[:37].float(), scale)
    assert ((got - w).abs().reshape(37, 3, 32) <= scale.unsqueeze(-1) * 0.5001).all()
    again = Q8Linear.from_weight(got, None)  # a q8_0 file's weights come back as they were
    assert torch.equal(dequantize(again.packed, again.scales, 37, 96), got)


@pytest.mark.parametrize("k", [96, 896])
@pytest.mark.parametrize("rows", [1, 3, 8, 11, 40])
def test_the_kernel_computes_what_its_weights_say(k: int, rows: int) -> None:
    torch.manual_seed(k + rows)
    layer = Q8Linear.from_weight(torch.randn(40, k), torch.randn(40))
    x = torch.randn(rows, k)
    want = reference(x, layer)
    torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    for i in range(rows):  # a row's numbers are its own
        assert torch.equal(layer(x[i : i + 1])[0], layer(x)[i])


def test_a_joint_call_adds_into_a_residual_with_the_norm_or_swiglu_on_the_way_in() -> None:
    torch.manual_seed(1)
    q, k = Q8Linear.from_weight(torch.randn(48, 64), None), Q8Linear.from_weight(torch.randn(16, 64), torch.randn(16))
    joint = JointLinears([q, k])
    x, weight = torch.randn(5, 64), torch.rand(64) + 0.5
    assert torch.equal(joint(x), torch.cat([q(x), k(x)], dim=-1))
    assert torch.equal(joint(x, norm=(weight, 1e-6)), joint(layer_ops.rms_norm(x, weight, 1e-6)))
    residual = torch.randn(5, 64)
    assert torch.equal(joint(x, into=residual.clone()), residual + joint(x))
    down = JointLinears([q])
    gate_up = torch.randn(5, 128)
    assert torch.equal(down(gate_up, gated=True), q(layer_ops.swiglu(gate_up)))
    with pytest.raises(ValueError, match="one kind"):
        JointLinears([q, int4_linear.Int4Linear.from_weight(torch.randn(16, 64), None)])


def test_a_joints_c_struct_names_its_kernel_and_points_at_the_arrays_a_call_passes() -> None:
    # decode_layers.c reads these: bits picks q8_linears, the pointers are the call's own arrays.
    q, k = Q8Linear.from_weight(torch.randn(48, 64), None), Q8Linear.from_weight(torch.randn(16, 64), torch.randn(16))
    joint = JointLinears([q, k])
    args = joint.joint_args()
    n, qw, scales, mins, out, bias = joint.weight_args
    assert (args.bits, args.nw) == (8, 2)
    assert [args.qw, args.scales, args.mins, args.N, args.bias] == [
        ctypes.addressof(a) for a in (qw, scales, mins, out, bias)]
    assert list(out) == [48, 16] and list(bias) == [None, k.bias.data_ptr()]


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU runs the AVX2 path already")
@pytest.mark.parametrize("rows", [1, 5, 9])
def test_the_avx2_path_computes_the_same_on_an_avx512_machine(rows: int) -> None:
    narrow = kernels.load(("-mno-avx512f",))
    assert not isinstance(narrow, str), narrow
    torch.manual_seed(rows)
    layer = Q8Linear.from_weight(torch.randn(40, 192), torch.randn(40))  # the layout is the same on both paths
    x = torch.randn(rows, 192)
    y = torch.empty(rows, 40)
    narrow.q8_linears(x.data_ptr(), rows, 192, *layer._joint.weight_args, y.data_ptr(), 0, None, 0.0, 0)
    want = reference(x, layer)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_linear_built_a_chunk_of_rows_at_a_time_is_the_one_built_whole(kind: str) -> None:
    # The loaders build a real vocabulary's output head this way (its float32 copy is never
    # whole): chunks of whole 16-output blocks, the last one ragged, land where the whole
    # weight's blocks would.
    from jupyter_infer.cpu.int4_linear import Int4Linear
    from jupyter_infer.cpu.kernel_linear import CHUNK_ROWS

    cls = Int4Linear if kind == "int4" else Q8Linear
    weight, bias = torch.randn(CHUNK_ROWS + 37, 96), torch.randn(CHUNK_ROWS + 37)
    asked: list[tuple[int, int]] = []

    def rows(first: int, stop: int) -> torch.Tensor:
        asked.append((first, stop))
        return weight[first:stop].clone()

    chunked, whole = cls.from_rows(rows, tuple(weight.shape), bias), cls.from_weight(weight, bias)
    assert asked == [(0, CHUNK_ROWS), (CHUNK_ROWS, CHUNK_ROWS + 37)]
    assert chunked.out_features == whole.out_features and chunked.in_features == whole.in_features
    for name, buf in whole.named_buffers():
        assert torch.equal(dict(chunked.named_buffers())[name], buf), name
    x = torch.randn(3, 96)
    torch.testing.assert_close(chunked(x), whole(x), rtol=0, atol=0)
