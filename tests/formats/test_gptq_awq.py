"""Checkpoints quantized to 4 bits by GPTQ or AWQ (``quantization_config``): served on the CPU
in our int4 kernel with the checkpoint's own weights, no GPTQ or AWQ library installed.

The checkpoints are written here in each method's layout, packed as the methods' own packers
pack (GPTQ: eight inputs an int32, zero points stored one less in its first format; AWQ: eight
outputs an int32 in the order 0 2 4 6 1 3 5 7)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from server_helpers import TOKEN, assert_failed_saying, server_config
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from jupyter_infer.cpu import kernels
from jupyter_infer.cpu.int4_linear import Int4Linear, dequantize
from jupyter_infer.cpu.int8_linear import Q8Linear
from jupyter_infer.cpu.int8_linear import dequantize as q8_dequantize
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.formats import gptq_awq
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.values.config import ServiceConfig

needs_int4 = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's pack order


def _quantize(weight: torch.Tensor, group: int,
              bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric groups along the input: (q [N, K], zero points [N, K/G], float16 scales
    [N, K/G], and the float weight they stand for, ``(q - z) * scale``)."""
    n, k = weight.shape
    top = (1 << bits) - 1
    w = weight.float().view(n, k // group, group)
    lo, hi = w.amin(-1).clamp(max=0), w.amax(-1).clamp(min=0)
    scale = ((hi - lo) / top).clamp(min=1e-6).half()
    z = torch.round(-lo / scale.float()).clamp(1, top)  # >= 1: GPTQ's first format cannot store 0
    q = torch.clamp(torch.round(w / scale.float().unsqueeze(-1)) + z.unsqueeze(-1), 0, top)
    stands_for = ((q - z.unsqueeze(-1)) * scale.float().unsqueeze(-1)).view(n, k)
    return q.view(n, k).long(), z.long(), scale, stands_for


def _words(values: torch.Tensor, order: list[int], along: int, bits: int = 4) -> torch.Tensor:
    """32/bits values an int32 along dim ``along``: value ``order[j]`` of each in bits ``bits*j``."""
    out, per = 0, len(order)
    for j, pick in enumerate(order):
        part = values[pick::per] if along == 0 else values[:, pick::per]
        out = out | ((part & ((1 << bits) - 1)) << (bits * j))
    return torch.from_numpy(np.ascontiguousarray(out.numpy().astype(np.uint32)).view(np.int32))


def _pack(method: str, q: torch.Tensor, z: torch.Tensor, scale: torch.Tensor, group: int,
          g_idx: torch.Tensor | None, bits: int = 4) -> dict[str, torch.Tensor]:
    """One linear's tensors in ``method``'s layout (q, z, scale: ``_quantize``'s, [N, ...])."""
    straight = list(range(32 // bits))
    if method == "awq":
        return {"qweight": _words(q.t(), AWQ_ORDER, along=1), "qzeros": _words(z.t(), AWQ_ORDER, along=1),
                "scales": scale.t().contiguous()}
    k = q.shape[1]
    return {"qweight": _words(q.t(), straight, 0, bits), "qzeros": _words(z.t() - 1, straight, 1, bits),
            "scales": scale.t().contiguous(),
            "g_idx": (torch.arange(k) // group if g_idx is None else g_idx).to(torch.int32)}


def _checkpoints(source: Path, out: Path, method: str, group: int, act_order: bool,
                 bits: int = 4) -> tuple[Path, Path]:
    """``source`` quantized by ``method`` (folder 1) and the float weights it stands for (folder 2)."""
    packed_dir, float_dir = out / method, out / f"{method}-float"
    for folder in (packed_dir, float_dir):
        shutil.copytree(source, folder)
    tensors = load_file(source / "model.safetensors")
    packed, floats = {}, {}
    gen = torch.Generator().manual_seed(0)
    for name, value in tensors.items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS:
            k = value.shape[1]
            g_idx = torch.randperm(k, generator=gen) // group if act_order else None
            # Act-order: input i belongs to group g_idx[i], so quantize the columns in that order.
            columns = torch.argsort(g_idx, stable=True) if act_order else torch.arange(k)
            q, z, scale, stands_for = _quantize(value[:, columns], group, bits)
            inverse = torch.argsort(columns)
            q, stands_for = q[:, inverse], stands_for[:, inverse]
            packed.update({f"{prefix}.{key}": t
                           for key, t in _pack(method, q, z, scale, group, g_idx, bits).items()})
            floats[name] = stands_for.contiguous()
        else:  # what a GPTQ/AWQ checkpoint keeps float: float16
            packed[name] = value.half()
            floats[name] = value.half().float()
    save_file(packed, packed_dir / "model.safetensors")
    save_file(floats, float_dir / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    settings = ({"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": False,
                 "checkpoint_format": "gptq"} if method == "gptq" else
                {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"})
    (packed_dir / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16",
                                                        "quantization_config": settings}))
    return packed_dir, float_dir


CASES = {"gptq": ("gptq", 64, False, 4), "awq": ("awq", 128, False, 4), "gptq-act-order": ("gptq", 32, True, 4),
         "gptq-int8": ("gptq", 128, False, 8)}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoints(request: pytest.FixtureRequest, llama_model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    method, group, act_order, bits = CASES[request.param]
    return (request.param, *_checkpoints(llama_model_dir, tmp_path_factory.mktemp(request.param),
                                         method, group, act_order, bits))


def _load(path: Path) -> tuple[torch.nn.Module, Any, Any]:
    """``load_causal_lm``'s (model, linears report, load report) for the CPU in float32."""
    return load_causal_lm(str(path), dtype=torch.float32, device="cpu", local_files_only=True,
                          quantize="none", prepack=True)


@needs_int4
def test_every_quantized_linear_is_ours_holding_the_checkpoints_weights(checkpoints: tuple[str, Path, Path]) -> None:
    case, packed_dir, float_dir = checkpoints
    lm, linears, load = _load(packed_dir)
    kind, bits = (Q8Linear, "int8") if case == "gptq-int8" else (Int4Linear, "int4")
    assert linears.kernels.startswith(f"from {case[:4].upper()}: {bits}")
    assert load.streamed
    want = dict(AutoModelForCausalLM.from_pretrained(float_dir).named_modules())
    ours = [(n, m) for n, m in lm.named_modules() if isinstance(m, kind)]
    assert len(ours) == 2 * len(LINEARS)  # the LM head was float in the checkpoint: not ours to quantize
    for name, module in ours:
        weight = want[name].weight.detach()
        if kind is Q8Linear:  # q8_0's groups of 32: each value within half its step of the checkpoint's
            got = q8_dequantize(module.packed, module.scales, module.out_features, module.in_features)
            assert (got - weight).abs().max() <= weight.abs().max() / 127
        elif case == "gptq-act-order":  # groups that are not runs of inputs: quantized again in ours
            assert (dequantize(*module.rows()) - weight).abs().max() <= 0.25 * weight.abs().max()
            assert module.mins is None
        else:  # the checkpoint's values exactly; its zero points times scales rounded to float16
            torch.testing.assert_close(dequantize(*module.rows()), weight, rtol=0,
                                       atol=float(weight.abs().max()) * 2 ** -9)


@needs_int4
def test_the_model_computes_what_the_checkpoint_says(checkpoints: tuple[str, Path, Path]) -> None:
    case, packed_dir, float_dir = checkpoints
    ids = torch.randint(5, 1900, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(float_dir)(ids).logits
        got = _load(packed_dir)[0](ids).logits
    error = (got - want).norm() / want.norm()
    assert error < {"gptq-act-order": 0.2, "gptq-int8": 0.02}.get(case, 0.05), error  # int8 activations in ours


@needs_int4
def test_a_qwen2_checkpoint_keeps_its_attention_biases(llama_model_dir: Path, tmp_path: Path) -> None:
    """Qwen's own GPTQ/AWQ repositories are Qwen2 models: q/k/v carry float biases beside the
    packed weights."""
    source = tmp_path / "qwen2"
    config = Qwen2Config(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # initialised to zero: biases that change the answer
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(source)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_model_dir / name, source / name)
    packed_dir, float_dir = _checkpoints(source, tmp_path, "awq", 128, False)
    lm = _load(packed_dir)[0]
    assert lm.model.layers[0].self_attn.q_proj.bias is not None
    ids = torch.randint(5, 1900, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(float_dir)(ids).logits
        got = lm(ids).logits
    assert (got - want).norm() / want.norm() < 0.05


def test_other_methods_and_widths_are_left_to_transformers() -> None:
    class Config:
        def __init__(self, **settings: Any) -> None:
            self.quantization_config = settings

    assert gptq_awq.of(Config(quant_method="gptq", bits=3, group_size=128)) is None
    assert gptq_awq.of(Config(quant_method="awq", bits=8)) is None
    assert gptq_awq.of(Config(quant_method="awq", bits=4, version="gemv")) is None
    assert gptq_awq.of(Config(quant_method="gptq", bits=4, checkpoint_format="marlin")) is None
    assert gptq_awq.of(Config(quant_method="bitsandbytes", load_in_4bit=True)) is None
    assert gptq_awq.of(Config(quant_method="gptq", bits=4, group_size=-1)).group == 0  # a whole row
    assert gptq_awq.of(Config(quant_method="gptq", bits=4, checkpoint_format="gptq_v2")).zeros_one_less is False


@pytest.fixture
def jp_server_config(llama_model_dir: Path, tmp_path: Path) -> dict[str, Any]:
    packed_dir, _ = _checkpoints(llama_model_dir, tmp_path, "awq", 128, False)
    return server_config(engine="hf", model=str(packed_dir), max_new_tokens=16)


@needs_int4
@pytest.mark.timeout(300)
async def test_the_server_serves_an_awq_checkpoint(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> None:
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1", api_key=TOKEN,
                             max_retries=0)
    answer = await api.chat.completions.create(model="default", max_tokens=6, temperature=0,  # waits for the load
                                               messages=[{"role": "user", "content": "hello"}])
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["engine"] == "hf", status.get("fallback_reason")
    assert status["details"]["linear_kernels"].startswith("from AWQ: int4")
    assert answer.usage.completion_tokens == 6 or answer.choices[0].finish_reason == "stop"


@pytest.mark.asyncio
async def test_groups_our_int4_cannot_hold_are_refused_by_name_and_the_server_stays_up(
        llama_model_dir: Path, tmp_path: Path) -> None:
    packed_dir, _ = _checkpoints(llama_model_dir, tmp_path, "gptq", 16, False)
    reason = "its GPTQ groups of 16 inputs do not split into our groups of 32"
    with pytest.raises(ValueError, match=f"{packed_dir.name}: {reason}"):
        HFEngine(str(packed_dir), local_files_only=True)
    await assert_failed_saying(ServiceConfig(engine="auto", model=str(packed_dir)), reason)
