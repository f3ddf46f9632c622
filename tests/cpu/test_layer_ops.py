"""The decoder's small ops in C for the int4 path (cpu/layer_ops.py, layer_ops.c): each
computes what torch computes, to the bit (RoPE) or to float32's last bits (RMSNorm, SwiGLU,
decode attention), and a row's result is its own, whatever its batch-mates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jupyter_infer.cpu import int4_linear, kernels, layer_ops
from jupyter_infer.cpu.features import cpu_flags
from jupyter_infer.cpu.joint_linears import JointLinears

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason="no int4 kernel on this machine")


def test_joint_int4_linears_normalize_their_input_as_torch_does() -> None:
    torch.manual_seed(2)
    weight, eps = torch.rand(96) + 0.5, 1e-6
    x = torch.randn(5, 96) * torch.tensor([[0.01], [1.0], [30.0], [1.0], [1.0]])
    ours = layer_ops.rms_norm(x, weight, eps)
    torch.testing.assert_close(ours, torch.nn.functional.rms_norm(x, (96,), weight, eps), rtol=1e-6, atol=1e-7)
    for i in range(5):  # a row's norm is its own
        assert torch.equal(layer_ops.rms_norm(x[i:i + 1], weight, eps)[0], ours[i])
    joint = JointLinears([int4_linear.Int4Linear.from_weight(torch.randn(n, 96), None) for n in (32, 16)])
    assert torch.equal(joint(x, norm=(weight, eps)), joint(ours))  # the same norm, in the same call
    residual = torch.randn(5, 48)
    expected = residual + joint(ours)
    torch.testing.assert_close(joint(x, into=residual, norm=(weight, eps)), expected)
    with pytest.raises(ValueError, match="width"):
        joint(x, norm=(torch.ones(64), eps))


def test_an_int4_down_projection_reads_swiglu_of_gate_and_up_as_torch_does() -> None:
    torch.manual_seed(3)
    x = torch.randn(4, 2 * 104) * 4  # 104: SwiGLU's vector loop and its tail
    x[0, :8] = torch.tensor([-100.0, -87.5, -20.0, -1e-8, 0.0, 1e-8, 20.0, 100.0])  # exp's far ends
    gate, up = x.chunk(2, dim=-1)
    ours = layer_ops.swiglu(x)
    torch.testing.assert_close(ours, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-30)
    x = torch.cat([x[:, :96], x[:, 104:200]], dim=-1)  # int4's input width: a multiple of 32
    down = JointLinears([int4_linear.Int4Linear.from_weight(torch.randn(24, 96), None)])
    residual = torch.randn(4, 24)
    expected = residual + down(layer_ops.swiglu(x))
    assert torch.equal(down(x, into=residual, gated=True), expected)  # the same SwiGLU, in the same call
    with pytest.raises(ValueError, match="192 input columns"):
        down(layer_ops.swiglu(x), gated=True)


def test_int4_refuses_an_input_width_that_is_not_whole_groups() -> None:
    # The kernel reads groups of 32: a tail would be dropped without a word.
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_linear.Int4Linear.from_weight(torch.randn(24, 104), None)


def test_qwen3s_per_head_norms_are_its_modules_in_place() -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(4)
    q_norm, k_norm = Qwen3RMSNorm(64, eps=1e-6), Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    qkv = torch.randn(1, 3, 18, 64) * torch.tensor([0.01, 1.0, 30.0]).view(1, 3, 1, 1)  # 14 q, 2 k, 2 v heads
    ours = qkv.clone()
    layer_ops.head_norm_(ours, 0, 14, q_norm.weight, 1e-6)
    layer_ops.head_norm_(ours, 14, 2, k_norm.weight, 1e-6)
    with torch.no_grad():
        torch.testing.assert_close(ours[:, :, :14], q_norm(qkv[:, :, :14]), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(ours[:, :, 14:16], k_norm(qkv[:, :, 14:16]), rtol=1e-6, atol=1e-7)
    assert torch.equal(ours[:, :, 16:], qkv[:, :, 16:])  # the values are left alone


@pytest.mark.parametrize("tokens", [1, 7])
def test_the_int4_librarys_rope_is_torchs_to_the_bit(tokens: int) -> None:
    # In-place RoPE in C (no fused multiply-adds): greedy answers stay generate's only if
    # the rotation is exactly what transformers' ops compute.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(tokens)
    qkv = torch.randn(1, tokens, 18, 64) * 3  # 14 query + 2 key heads rotated, 2 value heads left alone
    cos, sin = torch.randn(1, tokens, 64), torch.randn(1, tokens, 64)
    q, k = apply_rotary_pos_emb(qkv[:, :, :14], qkv[:, :, 14:16], cos, sin, unsqueeze_dim=2)  # transformers' own
    rotated = qkv.clone()
    layer_ops.rope_(rotated, 16, cos, sin)
    assert torch.equal(rotated[:, :, :14], q) and torch.equal(rotated[:, :, 14:16], k)
    assert torch.equal(rotated[:, :, 16:], qkv[:, :, 16:])


@pytest.mark.parametrize(("rows", "columns", "dim"), [(1, 1, 64), (1, 37, 128), (3, 9, 80), (5, 130, 64), (2, 20, 36)])
def test_decode_attention_is_sdpas_with_grouped_heads_and_a_rows_padding_hidden(rows: int, columns: int,
                                                                                 dim: int) -> None:
    torch.manual_seed(rows * columns)
    heads, kv_heads, capacity = 14, 2, columns + 5
    qkv = torch.randn(1, rows, heads + 2 * kv_heads, dim)  # as the joint q/k/v call lays them out
    q = qkv[0, :, :heads]
    buf_k, buf_v = torch.randn(rows, kv_heads, capacity, dim), torch.randn(rows, kv_heads, capacity, dim)
    keys, values = buf_k[:, :, :columns], buf_v[:, :, :columns]  # a cache buffer's view, spare room after
    keep = torch.ones(rows, columns, dtype=torch.uint8)
    for r in range(rows):
        keep[r, : r * columns // (rows + 1)] = 0  # left padding: row r's first columns are not its own
    out = layer_ops.attend(q, keys, values, keep, 0.125)
    want = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=keep.bool()[:, None, None, :],
                                          scale=0.125, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer_ops.attend(q, keys, values, None, 0.125)[0], layer_ops.attend(q[:1], keys[:1], values[:1], None, 0.125)[0])
    unpadded = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, scale=0.125, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(layer_ops.attend(q, keys, values, None, 0.125), unpadded, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="keep"):
        layer_ops.attend(q, keys, values, keep.bool(), 0.125)
    with pytest.raises(ValueError, match="rows"):  # the kernel reads raw memory: shapes must agree
        layer_ops.attend(q, keys[:, :, :, : dim // 2], values[:, :, :, : dim // 2], None, 0.125)


BF16_DOT = "avx512_bf16" in cpu_flags()


def prompt_case(tokens: int, past: int, heads: int, kv_heads: int, dim: int) -> tuple[torch.Tensor, ...]:
    """Queries laid out as the joint q/k/v call lays them, keys and values as a cache buffer's
    view (spare room after, never read), and what SDPA says."""
    torch.manual_seed(tokens + past + dim)
    columns = tokens + past
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim)
    q = qkv[:, :heads]
    buf_k, buf_v = torch.randn(kv_heads, columns + 9, dim), torch.randn(kv_heads, columns + 9, dim)
    buf_k[:, columns:], buf_v[:, columns:] = float("nan"), float("nan")  # spare room: never read
    keys, values = buf_k[:, :columns], buf_v[:, :columns]
    # The queries are the last `tokens` positions: query i sees every past column and its own prompt's up to i.
    causal = torch.ones(tokens, columns, dtype=torch.bool).tril(past)
    want = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None], attn_mask=causal,
                                          scale=dim**-0.5, enable_gqa=True)[0].transpose(0, 1)
    return q, keys, values, want


CASES = [(1, 0, 2, 1, 64), (70, 0, 4, 2, 64), (130, 70, 6, 2, 128), (300, 0, 7, 1, 128), (64, 4033, 4, 4, 64)]


@pytest.mark.parametrize(("tokens", "past", "heads", "kv_heads", "dim"), CASES)
def test_prompt_attention_is_causal_sdpa_after_any_past(tokens: int, past: int, heads: int, kv_heads: int,
                                                        dim: int) -> None:
    q, keys, values, want = prompt_case(tokens, past, heads, kv_heads, dim)
    out = layer_ops.attend_prompt(q, keys, values, dim**-0.5)
    # Products of bfloat16s summed in float32 where the CPU has the bf16 dot; float32 elsewhere.
    close = 2e-2 if BF16_DOT else 1e-5
    torch.testing.assert_close(out, want, rtol=close, atol=close)


@pytest.mark.parametrize(("tokens", "past", "heads", "kv_heads", "dim"),
                         [*CASES, (33, 5, 4, 2, 16), (100, 17, 6, 3, 80), (200, 300, 4, 1, 96)])
def test_prompt_attention_in_float32_is_sdpa_on_every_cpu(tokens: int, past: int, heads: int, kv_heads: int,
                                                          dim: int) -> None:
    """The AVX2 kernel (attention_f32.c) that every CPU without the bf16 dot runs, here on any."""
    q, keys, values, want = prompt_case(tokens, past, heads, kv_heads, dim)
    out = layer_ops.attend_prompt(q, keys, values, dim**-0.5, precise=True)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU runs the AVX2 build already")
def test_an_avx2_build_attends_prompts_in_float32() -> None:
    narrow = kernels.load(("-mno-avx512f",))
    assert not isinstance(narrow, str), narrow
    q, keys, values, want = prompt_case(130, 70, 6, 2, 64)
    out = torch.empty_like(want)
    assert narrow.ji_attend_prompt(q.data_ptr(), 130, 6, q.stride(0), keys.data_ptr(), values.data_ptr(), 2,
                                   keys.stride(0), 200, 64, 64**-0.5, out.data_ptr()) == 0
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_prompt_attention_declines_what_it_does_not_run_and_refuses_bad_layouts() -> None:
    q, kv = torch.randn(8, 4, 24), torch.randn(2, 8, 24)
    assert layer_ops.attend_prompt(q, kv, kv, 0.2) is None  # a head dim not a multiple of 16: SDPA's
    q, kv = torch.randn(8, 4, 64), torch.randn(2, 8, 64)
    with pytest.raises(ValueError, match="columns"):
        layer_ops.attend_prompt(q, kv[:, :4], kv[:, :4], 0.2)  # fewer columns than queries
    with pytest.raises(ValueError, match="layout"):
        layer_ops.attend_prompt(q, kv, kv.transpose(1, 2).contiguous().transpose(1, 2), 0.2)
