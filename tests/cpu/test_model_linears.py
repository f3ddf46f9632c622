"""CPU linears swapped into the model at load: oneDNN-prepacked weights (the default) and
weight-only int8. Same answers as the eager model (within float tolerance), and the engine
says which kernels it runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.commands.model_builder import CORPUS
from jupyter_infer.cpu import kernels, model_linears
from jupyter_infer.cpu.float_linear import F32Linear
from jupyter_infer.cpu.int8_linear import Q8Linear
from jupyter_infer.cpu.model_linears import OURS, Int8Linear, PackedLinear, swap_linears
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.formats import device_choice
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.values.config import ServiceConfig

needs_int8 = pytest.mark.skipif(not model_linears.int8_available(), reason="no int8 kernel (ours or fbgemm) here")
INT8 = (Int8Linear, Q8Linear)  # fbgemm's, or ours (q8_0's form) where the int4 library builds


@pytest.fixture(params=["tiny_model_dir", "llama_model_dir"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits[0].float()


def _text_ids(model_dir: Path, tokens: int = 256) -> torch.Tensor:
    return AutoTokenizer.from_pretrained(model_dir)(CORPUS, return_tensors="pt").input_ids[:, :tokens]


@pytest.mark.parametrize("ours", [True, False])
def test_prepacked_linears_compute_what_the_eager_ones_do(model_dir: Path, ours: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 is ours where the kernel library builds, oneDNN's prepacked weights where it does not.
    if ours and kernels.unavailable() is not None:
        pytest.skip("no kernel library on this machine")
    if not ours:
        monkeypatch.setattr(kernels, "unavailable", lambda: "as where the library cannot build")
    kind, expected = (F32Linear, model_linears.F32_KERNELS) if ours else (PackedLinear, "onednn prepacked float32")
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    packed = copy.deepcopy(eager)
    report = swap_linears(packed, prepack=True)
    linears = [m for m in packed.modules() if isinstance(m, kind)]
    assert report.layers == len(linears) > 0 and report.kernels == expected
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    ids = _text_ids(model_dir)
    want, got = _logits(eager, ids), _logits(packed, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # sums in another order, nothing more
    assert (got.argmax(-1) == want.argmax(-1)).all()


@needs_int8
def test_int8_keeps_the_greedy_choices_of_float32(model_dir: Path) -> None:
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    quantized = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    report = swap_linears(quantized, prepack=True, quantize="int8")
    assert report.layers == sum(isinstance(m, INT8) for m in quantized.modules()) > 0
    ids = _text_ids(model_dir)
    want, got = _logits(eager, ids), _logits(quantized, ids)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    # A bf16 model's activations go in and come out as bf16.
    layer = next(m for m in quantized.modules() if isinstance(m, INT8))
    x = torch.randn(3, layer.in_features)
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    torch.testing.assert_close(layer(x.bfloat16()).float(), layer(x), rtol=0.05, atol=0.05)


@pytest.mark.skipif(kernels.unavailable() is not None, reason="no kernel library on this machine")
def test_bfloat16_in_our_kernel_keeps_the_greedy_choices_of_float32(model_dir: Path) -> None:
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    report = swap_linears(ours, prepack=True)
    assert report.kernels == model_linears.BF16_KERNELS and report.layers > 0
    ids = _text_ids(model_dir)
    want, got = _logits(eager, ids), _logits(ours, ids)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_the_engine_says_which_kernels_it_runs(tiny_model_dir: Path) -> None:
    ours = kernels.unavailable() is None
    prepacked = model_linears.F32_KERNELS if ours else "onednn prepacked float32"
    assert HFEngine(str(tiny_model_dir), dtype="float32").info.details["linear_kernels"] == prepacked
    eager = HFEngine(str(tiny_model_dir), dtype="float32", prepack_weights=False)
    assert eager.info.details["linear_kernels"] == "eager (aten addmm)"


@pytest.mark.parametrize("quantize", ["none", pytest.param("int8", marks=needs_int8), "int4"])
def test_the_engine_counts_the_models_parameters_whatever_its_linears_run_on(model_dir: Path, quantize: str) -> None:
    """infer/status's ``parameters``: a swapped linear's weights count once, a tied output head
    (its own packed copy of the embedding) not again. Prepacked linears once went uncounted:
    Qwen2.5-0.5B's shape said 3.0M."""
    expected = AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    engine = HFEngine(str(model_dir), dtype="float32", quantize=quantize)
    assert engine.info.details["parameters"] == expected


@pytest.mark.skipif(not model_linears.fbgemm_available(), reason="no fbgemm here")
def test_int8_is_fbgemms_where_our_kernel_cannot_build(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(kernels, "unavailable", lambda: "no C compiler here")
    engine = HFEngine(str(tiny_model_dir), dtype="float32", quantize="int8")
    assert engine.info.details["linear_kernels"].startswith("int8 dynamic (fbgemm)")
    assert any(isinstance(m, Int8Linear) for m in engine.model.modules())
    assert not any(isinstance(m, Q8Linear) for m in engine.model.modules())


def test_int8_is_refused_where_it_cannot_run(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_choice, "int8_available", lambda: False)
    with pytest.raises(ValueError, match="int8 kernel"):
        HFEngine(str(tiny_model_dir), quantize="int8")
    with pytest.raises(ValueError, match="CPU weight format"):
        device_choice.check_quantize("int8", "cuda")
    with pytest.raises(ValueError, match="InferApp.quantize"):
        ServiceConfig(quantize="int3")


@needs_int8
@pytest.mark.asyncio
async def test_int8_serves_through_the_service(tiny_model_dir: Path) -> None:
    from jupyter_infer.service.inference import InferenceService
    from jupyter_infer.values.request import Request, SamplingParams

    service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), quantize="int8"))
    service.start()
    try:
        await service.wait_ready(60)
        details = service.status()["details"]
        assert details["linear_kernels"].startswith("int8") and details["quantize"] == "int8"
        assert service.status()["dtype"] == "float32"  # what the int8 kernels take
        stream = await service.submit(Request("KV cache", SamplingParams(max_tokens=6, ignore_eos=True)))
        result = await stream.result()
        assert result.completion_tokens == len(result.token_ids) == 6 and result.finish_reason == "length"
    finally:
        await service.stop()


@pytest.mark.parametrize("ours", [True, False])
def test_bfloat16_loads_on_a_cpu_where_onednn_cannot_prepack_it(tiny_model_dir: Path, ours: bool) -> None:
    """On an AVX2-only CPU oneDNN refuses to prepack bfloat16 (it crashed the engine's load):
    our kernel serves it there, and where our library cannot build either, the eager linears
    do. ``ONEDNN_MAX_CPU_ISA=AVX2`` makes this CPU one, in a process of its own."""
    import json
    import os
    import subprocess
    import sys

    if ours and kernels.unavailable() is not None:
        pytest.skip("no kernel library on this machine")
    script = (
        "import json, sys\n"
        "from jupyter_infer.cpu import kernels\n"
        + ("" if ours else "kernels.unavailable = lambda: 'no library'\n") +
        "from jupyter_infer.engine.hf.hf_engine import HFEngine\n"
        "e = HFEngine(sys.argv[1], dtype='bfloat16', num_threads=1)\n"
        "ids = e.text.tokenize('Hello there')\n"
        "out = e.model.generate(__import__('torch').tensor([ids]), max_new_tokens=4, do_sample=False)\n"
        "print(json.dumps({'kernels': e.info.details['linear_kernels'], 'new': out.shape[1] - len(ids)}))\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if ours:
        assert report["kernels"] == model_linears.BF16_KERNELS
    else:
        assert report["kernels"].startswith("eager (aten addmm): oneDNN cannot prepack here")
    assert report["new"] == 4


@pytest.mark.skipif(kernels.unavailable() is not None, reason="no kernel library on this machine")
@pytest.mark.parametrize("quantize", ["none", "int8", "int4"])
def test_a_checkpoint_loaded_whole_keeps_the_weights_our_kernels_read(llama_model_dir: Path, tmp_path: Path,
                                                                      quantize: str) -> None:
    """A .bin checkpoint is loaded whole, its linears swapped after; copying the float tensors
    out of the file's memory map then copied our linears' buffers too, and the kernels, which
    hold their addresses, read freed memory (a crash in the first forward with q/k/v biases)."""
    eager = AutoModelForCausalLM.from_pretrained(llama_model_dir, dtype=torch.float32)
    eager.model.layers[0].self_attn.q_proj.bias = torch.nn.Parameter(torch.randn(eager.config.hidden_size))
    for folder in ("bin", "safetensors"):
        eager.save_pretrained(tmp_path / folder)
    (tmp_path / "bin" / "model.safetensors").unlink()  # the older format: one pickled state dict
    torch.save(eager.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    load = {"dtype": torch.float32, "device": "cpu", "local_files_only": True, "quantize": quantize, "prepack": True}
    whole, _, report = load_causal_lm(str(tmp_path / "bin"), **load)
    reference = load_causal_lm(str(tmp_path / "safetensors"), **load)[0]
    assert not report.streamed
    ours = [m for m in whole.modules() if isinstance(m, OURS)]
    # the addresses the kernel reads (weights, scales, mins, bias) are the linear's own buffers
    assert ours and all({a for a in (*m._weights[:3], m._weights[4]) if a} <= {b.data_ptr() for b in m.buffers()}
                        for m in ours)
    ids = _text_ids(llama_model_dir, 64)
    assert torch.equal(_logits(whole, ids), _logits(reference, ids))
