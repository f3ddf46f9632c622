"""float32 and bfloat16 linears in our kernel (cpu/float_linear.py, float.c): the blocks
hold the weights as they are (bfloat16's rounding for bfloat16), the kernel computes x W^T + b
in float32 for one row and many (a part-empty last
block, any input width), into a residual, with the norm or SwiGLU on the way in, on the AVX-512
and the AVX2 paths, and a row's numbers are its own whatever its batch-mates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jupyter_infer.cpu import kernels, layer_ops
from jupyter_infer.cpu.features import cpu_flags
from jupyter_infer.cpu.float_linear import BF16Linear, F32Linear, unpack
from jupyter_infer.cpu.joint_linears import JointLinears

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason="no kernel library on this machine")


KINDS = [F32Linear, BF16Linear]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def _expected(x: torch.Tensor, layer: F32Linear, b: torch.Tensor, flags: tuple[str, ...] = ()) -> torch.Tensor:
    """x W^T + b in float64, W as the layer holds it; with bfloat16 weights on a CPU with
    AVX512-BF16 (unless the build's ``flags`` leave it out), x rounded to bfloat16 first."""
    native = "avx512_bf16" in cpu_flags() and not {"-mno-avx512f", "-mno-avx512bf16"} & set(flags)
    if isinstance(layer, BF16Linear) and native:
        x = x.bfloat16()
    return x.double() @ unpack(layer.packed, layer.out_features, layer.in_features).double().t() + b.double()


@pytest.mark.parametrize("kind", KINDS)
def test_the_blocks_hold_the_weights_as_they_are(kind: type[F32Linear]) -> None:
    w = torch.randn(37, 50)  # 37 outputs: the last block of 16 is part-empty
    layer = kind(w, None)
    assert torch.equal(unpack(layer.packed, 37, 50), w.to(kind.DTYPE))
    assert layer.packed.shape == ((3, 50, 16) if kind is F32Linear else (3, 25, 16, 2))
    assert not layer.packed[2, :, 5:].any()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [50, 51, 896])  # 51: bfloat16's last pair is half padding
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_the_kernel_computes_x_w_plus_b(kind: type[F32Linear], k: int, rows: int) -> None:
    torch.manual_seed(k + rows)
    w, b = torch.randn(37, k), torch.randn(37)
    layer, x = kind(w, b), torch.randn(rows, k)
    _close(layer(x), _expected(x, layer, b))
    for i in range(rows):  # a row's numbers are its own
        assert torch.equal(layer(x[i : i + 1])[0], layer(x)[i])
    assert layer(x.bfloat16()).dtype == torch.bfloat16  # another dtype goes in and comes out as itself


def test_a_joint_call_adds_into_a_residual_with_the_norm_or_swiglu_on_the_way_in() -> None:
    torch.manual_seed(1)
    q, k = F32Linear(torch.randn(48, 64), None), F32Linear(torch.randn(16, 64), torch.randn(16))
    joint = JointLinears([q, k])
    x, weight = torch.randn(5, 64), torch.rand(64) + 0.5
    assert torch.equal(joint(x), torch.cat([q(x), k(x)], dim=-1))
    assert torch.equal(joint(x, norm=(weight, 1e-6)), joint(layer_ops.rms_norm(x, weight, 1e-6)))
    residual = torch.randn(5, 64)
    assert torch.equal(joint(x, into=residual.clone()), residual + joint(x))
    gate_up = torch.randn(5, 128)
    assert torch.equal(JointLinears([q])(gate_up, gated=True), q(layer_ops.swiglu(gate_up)))


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU runs the AVX2 path already")
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512bf16",)])  # AVX2; AVX-512 widening bf16
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 4, 5, 9])
def test_the_narrower_paths_compute_the_same_on_an_avx512_machine(flags: tuple[str, ...], kind: type[F32Linear],
                                                                 rows: int) -> None:
    narrow = kernels.load(flags)
    assert not isinstance(narrow, str), narrow
    torch.manual_seed(rows)
    w, b = torch.randn(40, 193), torch.randn(40)
    layer, x, y = kind(w, b), torch.randn(rows, 193), torch.empty(rows, 40)
    getattr(narrow, kind.JOINT)(x.data_ptr(), rows, 193, *layer._joint.weight_args, y.data_ptr(), 0, None, 0.0, 0)
    _close(y, _expected(x, layer, b, flags))


def test_a_bfloat16_checkpoint_on_the_cpu_is_float32_with_bfloat16_weights(llama_model_dir: Path) -> None:
    # Held as float32 (hf_load.held_as): the weights are bfloat16's rounding, half the read, and
    # the decode step runs in C; what the model computes is the checkpoint with its linears'
    # weights rounded to bfloat16.
    from transformers import AutoModelForCausalLM

    from jupyter_infer.engine.hf import HFEngine

    engine = HFEngine(str(llama_model_dir), dtype="bfloat16", num_threads=2)
    assert engine.info.dtype == "bfloat16" and "bfloat16" in engine.info.details["linear_kernels"]
    linears = [m for m in engine.model.modules() if isinstance(m, F32Linear)]
    assert linears and all(type(m) is BF16Linear for m in linears)
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    c = engine.model.config
    assert engine.kv_bytes_per_token == 2 * 4 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim  # float32
    assert engine.llama_forward.one_call is not None
    reference = AutoModelForCausalLM.from_pretrained(llama_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
        ids = torch.randint(5, 1900, (1, 24), generator=torch.Generator().manual_seed(0))
        want, got = reference(ids).logits, engine.model(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0.05 * want.abs().max().item())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
