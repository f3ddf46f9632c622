"""GGUF files (``InferApp.model = "model-q4_0.gguf"``): their 4-bit blocks become our int4
groups as they are, the model computes what the file's weights say, the file's tokenizer,
chat template and end-of-sequence token are the ones served, and a file we cannot serve is
refused by name with the server left up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from gguf_files import write_llama_gguf
from server_helpers import TOKEN, assert_failed_saying, server_config
from test_int4_linear import assert_own_greedy_choices
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.cpu import kernels
from jupyter_infer.cpu.int4_linear import Int4Linear, dequantize
from jupyter_infer.cpu.int8_linear import Q8Linear
from jupyter_infer.cpu.int8_linear import dequantize as q8_dequantize
from jupyter_infer.cpu.model_linears import Int8Linear
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.formats import gguf_load
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

gguf = pytest.importorskip("gguf")
needs_int4 = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


@pytest.fixture(scope="module")
def gguf_dir(llama_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf")
    for kind in ("F32", "Q4_0", "Q4_1", "Q8_0"):
        write_llama_gguf(llama_model_dir, out / f"model-{kind.lower()}.gguf", kind)
    return out


def _load(path: Path, quantize: str = "none") -> torch.nn.Module:
    return load_causal_lm(str(path), dtype=torch.float32, device="cpu", local_files_only=True,
                          quantize=quantize, prepack=True)[0]


def _ours(nibbles: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None) -> np.ndarray:
    return dequantize(nibbles, scales, mins).numpy()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_4bit_blocks_become_our_groups_as_they_are(kind: str) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((24, 256)).astype(np.float32)
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType[kind])
    want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    got = _ours(*gguf_load._DIRECT[kind](blocks))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_q4_k_super_blocks_become_eight_of_our_groups() -> None:
    """gguf-py cannot write q4_K, so random super-blocks: any bytes are a valid block."""
    rng = np.random.default_rng(1)
    rows, per_row = 8, 3  # 3 super-blocks of 256 a row
    blocks = rng.integers(0, 256, size=(rows * per_row, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)  # d and dmin: finite, realistic
    blocks[:, 2:4] = np.array([0.003], np.float16).view(np.uint8)
    raw = blocks.reshape(rows, -1)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    got = _ours(*gguf_load._q4_k(raw))
    # Each sub-block's scale d * sc is rounded to float16 (q4_K keeps it as two factors).
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_a_float32_file_is_the_checkpoint_with_its_tokenizer_and_template(gguf_dir: Path,
                                                                         llama_model_dir: Path) -> None:
    ids = torch.randint(5, 1900, (2, 24), generator=torch.Generator().manual_seed(0))
    want = AutoModelForCausalLM.from_pretrained(llama_model_dir)(ids).logits
    lm = _load(gguf_dir / "model-f32.gguf")
    assert not any(isinstance(m, (Int4Linear, Int8Linear)) for m in lm.modules())  # float stays float
    with torch.no_grad():
        got = lm(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # q/k rows un-permuted right
    ours, theirs = gguf_load.load_tokenizer(str(gguf_dir / "model-f32.gguf")), AutoTokenizer.from_pretrained(llama_model_dir)
    text = "<|user|>\nWhat is a KV cache, in 2 words? ünïcode<|endoftext|>"
    assert ours(text).input_ids == theirs(text).input_ids
    assert ours.chat_template == theirs.chat_template  # transformers' GGUF tokenizer drops it
    assert ours.eos_token_id == theirs.eos_token_id is not None


@needs_int4
@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
def test_a_4bit_file_is_served_in_int4_with_the_files_own_weights(gguf_dir: Path, kind: str) -> None:
    path = gguf_dir / f"model-{kind}.gguf"
    lm = _load(path)
    theirs = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=path.name)  # dequantized to float32
    layers = dict(theirs.named_modules())
    int4 = [(n, m) for n, m in lm.named_modules() if isinstance(m, Int4Linear)]
    assert len(int4) == 2 * 7 + 1  # every linear of both layers and the LM head
    assert all((m.mins is None) == (kind == "q4_0") for _, m in int4)  # q4_0's 4.5 bits a weight, as in the file
    for name, module in int4:
        np.testing.assert_allclose(_ours(*module.rows()),
                                   layers[name].weight.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_wider_blocks_are_int8_and_a_named_format_takes_every_linear(gguf_dir: Path) -> None:
    lm = _load(gguf_dir / "model-q8_0.gguf")
    assert sum(isinstance(m, (Int8Linear, Q8Linear)) for m in lm.modules()) == 15
    ours = [(n, m) for n, m in lm.named_modules() if isinstance(m, Q8Linear)]
    if ours:  # our int8 is q8_0's own form: the file's weights, exactly
        theirs = dict(AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file="model-q8_0.gguf").named_modules())
        for name, module in ours:
            np.testing.assert_allclose(q8_dequantize(module.packed, module.scales, module.out_features,
                                                     module.in_features).numpy(),
                                       theirs[name].weight.detach().numpy(), rtol=0, atol=0)
    if kernels.unavailable() is None:
        lm = _load(gguf_dir / "model-q8_0.gguf", quantize="int4")
        assert sum(isinstance(m, Int4Linear) for m in lm.modules()) == 15  # the LM head too


@needs_int4
@pytest.mark.asyncio
async def test_greedy_answers_from_a_q4_0_file_are_its_own_choices(gguf_dir: Path) -> None:
    engine = HFEngine(str(gguf_dir / "model-q4_0.gguf"), num_threads=1)
    assert engine.info.details["linear_kernels"].startswith("from GGUF: int4")
    engine.text.eos_token_ids = frozenset()
    service = InferenceService(ServiceConfig(speculative="off"), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    prompts, lengths = ["Attention lets every token look", "What is dynamic batching?"], [10, 16]
    streams = [await service.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(prompts, lengths, strict=True)]
    results = [await s.result() for s in streams]
    await service.stop()
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert len(result.token_ids) == n
        assert_own_greedy_choices(engine, prompt, list(result.token_ids))  # near ties aside: test_int4


@pytest.fixture
def jp_server_config(gguf_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(gguf_dir / "model-q4_0.gguf"), max_new_tokens=32)


@needs_int4
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_server_serves_a_gguf_file_through_its_chat_template(
        jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> None:
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1", api_key=TOKEN,
                             max_retries=0)
    answer = await api.chat.completions.create(model="default", max_tokens=5, temperature=0,  # waits for the load
                                               messages=[{"role": "user", "content": "hello"}])
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["engine"] == "hf" and status["model"].endswith("model-q4_0.gguf")
    assert status["details"]["chat_template"] is True and "int4" in status["details"]["linear_kernels"]
    assert answer.usage.prompt_tokens == len(  # the file's template, rendered by transformers
        gguf_load.load_tokenizer(status["model"]).apply_chat_template(
            [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=True)["input_ids"])
    assert answer.choices[0].finish_reason in ("stop", "length")


def _unknown_architecture(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(b"GGUF" + bytes(60)) and p, "cannot read it as GGUF"),
    (lambda p: p.write_bytes(b"not a gguf at all") and p, "not a GGUF file"),
    (_unknown_architecture, "its architecture 'rwkv7' is not one transformers reads"),
    (lambda p: p, "no such GGUF file"),
])
@pytest.mark.asyncio
async def test_a_gguf_file_we_cannot_serve_is_refused_by_name_and_the_server_stays_up(
        tmp_path: Path, make: Any, reason: str) -> None:
    path = tmp_path / "model-q4_0.gguf"
    make(path)
    with pytest.raises(ValueError, match=f"model-q4_0.gguf: {reason}"):
        HFEngine(str(path), local_files_only=True)
    await assert_failed_saying(ServiceConfig(engine="auto", model=str(path)), reason)
