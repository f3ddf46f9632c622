"""4-bit weights (``quantize="int4"``): the kernel computes what its stored weights say, a
row's numbers never depend on its batch-mates (on either side of the many-rows path's
threshold), the engine's greedy answers equal
``generate`` on the same quantized model, and the model loads streamed, a linear at a time,
without a float32 copy of itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from server_helpers import assert_failed_saying
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.cpu import kernels
from jupyter_infer.cpu.features import cpu_flags
from jupyter_infer.cpu.int4_linear import GROUP, Int4Linear, dequantize, quantize
from jupyter_infer.cpu.joint_linears import JointLinears
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.formats import device_choice
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

NEAR_TIE = 5e-3  # the random-weight model's top and tenth logits are ~0.1-0.2 apart

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


def reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """The kernel's arithmetic in torch: activations rounded to int8 per group of 32 (one
    scale each), dotted with the 4-bit values, scaled; float64 so only the order of sums
    can differ from the kernel's."""
    w = dequantize(*layer.rows()).double()
    xg = x.double().reshape(x.shape[0], -1, GROUP)
    d = xg.abs().amax(-1, keepdim=True).float().double() / 127
    xq = torch.where(d > 0, (xg / d).round(), torch.zeros_like(xg)) * d
    y = xq.reshape(x.shape) @ w.t()
    return y if layer.bias is None else y + layer.bias.double()


def with_mins(n: int, k: int) -> Int4Linear:
    """A linear in q4_1's form (a float16 min per group, as GGUF's q4_1 and q4_K files give)."""
    return Int4Linear(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
                      (torch.rand(n, k // GROUP) / 10 + 0.01).half(), (torch.randn(n, k // GROUP) / 2).half(),
                      torch.randn(n))


@pytest.mark.parametrize("k", [96, 192, 288, 896])  # 3, 6, 9 and 28 groups: every path
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("form", ["q4_0", "q4_1"])
def test_the_kernel_computes_what_its_weights_say(k: int, rows: int, form: str) -> None:
    torch.manual_seed(k + rows)
    layer = Int4Linear.from_weight(torch.randn(40, k), torch.randn(40)) if form == "q4_0" else with_mins(40, k)
    assert (layer.mins is None) == (form == "q4_0")
    x = torch.randn(rows, k)
    got = layer(x).double()
    want = reference(x, layer)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU runs the AVX2 path already")
@pytest.mark.parametrize("k", [96, 192, 896])
def test_the_avx2_path_computes_the_same_on_an_avx512_machine(k: int) -> None:
    # CI and users' machines are AVX2 some days and AVX-512 others: each path is checked.
    narrow = kernels.load(("-mno-avx512f",))
    assert not isinstance(narrow, str), narrow
    torch.manual_seed(k)
    for layer, rows in ((Int4Linear.from_weight(torch.randn(40, k), torch.randn(40)), 1),
                        (Int4Linear.from_weight(torch.randn(40, k), None), 5), (with_mins(40, k), 1), (with_mins(40, k), 5)):
        x = torch.randn(rows, k)
        y = torch.empty(rows, 40)
        narrow.q4_linear(x.data_ptr(), rows, k, *layer._weights, y.data_ptr())
        want = reference(x, layer)
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_a_rows_numbers_do_not_depend_on_its_batch_mates() -> None:
    torch.manual_seed(0)
    layer = Int4Linear.from_weight(torch.randn(64, 256), None)
    x = torch.randn(7, 256)
    together = layer(x)
    for i in range(7):
        assert torch.equal(layer(x[i:i + 1])[0], together[i])
    assert torch.equal(layer(x.reshape(7, 1, 256)).reshape(7, 64), together)  # any leading shape


@pytest.mark.parametrize("k", [96, 192, 288, 896])
@pytest.mark.parametrize("form", ["q4_0", "q4_1"])
def test_many_rows_compute_the_same_in_the_kernels_blocks(k: int, form: str) -> None:
    # The weights live in blocks of 16 outputs (int4.c), and 8 rows (4 on AVX2) share a
    # pass: 21 rows are passes and a remainder, and 40 outputs leave the last block part-empty.
    # Into a residual too, as the decoder adds.
    torch.manual_seed(k)
    layer = Int4Linear.from_weight(torch.randn(40, k), torch.randn(40)) if form == "q4_0" else with_mins(40, k)
    x = torch.randn(21, k)
    want = reference(x, layer)
    torch.testing.assert_close(layer(x).double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    residual = torch.randn(21, 40)
    added = JointLinears([layer])(x, into=residual.clone())
    torch.testing.assert_close(added.double(), want + residual.double(), rtol=1e-4, atol=1e-4 * want.abs().max().item())
    # A row's numbers are its own: the first rows alike in a batch of any size.
    assert torch.equal(layer(x[:9])[:8], layer(x)[:8])


@pytest.mark.parametrize("form", ["q4_0", "q4_1"])
def test_the_blocks_give_back_the_rows_they_were_made_from(form: str) -> None:
    # The row form is GGUF's and the quantizer's; the blocks are only the kernel's order.
    torch.manual_seed(3)
    nibbles = torch.randint(0, 256, (37, 48), dtype=torch.uint8)
    scales = torch.rand(37, 3).half()
    mins = None if form == "q4_0" else torch.randn(37, 3).half()
    layer = Int4Linear(nibbles, scales, mins, None)
    got = layer.rows()
    assert torch.equal(got[0], nibbles) and torch.equal(got[1], scales)
    assert got[2] is None if mins is None else torch.equal(got[2], mins)
    x = torch.randn(2, 96)
    want = x.double() @ dequantize(nibbles, scales, mins).double().t()
    torch.testing.assert_close(layer(x).double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def llama_cpp_q4_0(w: torch.Tensor) -> torch.Tensor:
    """What llama.cpp's q4_0 keeps of ``w`` (``quantize_row_q4_0_ref``): scale = -max / 8, max
    the group's value of largest magnitude, levels rounded half up."""
    g = w.reshape(w.shape[0], -1, GROUP)
    mx = g.gather(-1, g.abs().argmax(-1, keepdim=True))
    d = (mx / -8).half().float()
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return (((g * inv + 8.5).clamp(0, 15.99).floor() - 8) * d).reshape(w.shape)


@pytest.mark.parametrize("weights", ["normal", "heavy-tailed"])
def test_quantized_weights_are_close_and_the_search_beats_llama_cpps_q4_0(weights: str) -> None:
    torch.manual_seed(1)
    w = torch.randn(128, 512) if weights == "normal" else torch.distributions.StudentT(4.0).sample((128, 512))
    nibbles, scales, mins = quantize(w)
    assert mins is None and nibbles.shape == (128, 256) and scales.shape == (128, 16)  # 4.5 bits a weight
    got = dequantize(nibbles, scales, mins)
    assert ((got - w).square().mean().sqrt() / w.std()).item() < 0.12
    assert (got - w).square().sum() < 0.95 * (llama_cpp_q4_0(w) - w).square().sum()
    # A bf16 input comes back as bf16; the arithmetic is the float32 path's.
    layer = Int4Linear.from_weight(w, None)
    x = torch.randn(2, 512)
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    # A model cast or moved as a whole leaves the 4-bit weights (whose addresses the kernel
    # holds) untouched, and still computes the same.
    before = layer(x)
    layer.float().to("cpu")
    assert layer.scales.dtype == torch.float16 and torch.equal(layer(x), before)


@pytest.fixture(params=["tiny_model_dir", "llama_model_dir"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def test_the_model_loads_streamed_and_keeps_float32s_greedy_choices(model_dir: Path) -> None:
    f32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lm, linears, load = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu",
                                       local_files_only=True, quantize="int4", prepack=True)
    assert load.streamed and linears.layers == sum(isinstance(m, Int4Linear) for m in lm.modules()) > 0
    assert not any(type(m) is torch.nn.Linear for m in lm.modules())
    ids = AutoTokenizer.from_pretrained(model_dir)("The quick brown fox jumps over the lazy dog. " * 8,
                                                   return_tensors="pt").input_ids
    with torch.inference_mode():
        want, got = f32(input_ids=ids).logits[0], lm(input_ids=ids).logits[0]
    # Random weights give nearly flat logits, where any rounding flips some choices.
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.6
    assert torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1] > 0.9
    # The int4 model holds less than int8's and far less than float32's.
    int8 = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu", local_files_only=True,
                          quantize="int8", prepack=True)[2]
    f32_bytes = sum(p.numel() * 4 for p in f32.parameters())
    assert load.weight_bytes < int8.weight_bytes < f32_bytes


@pytest.mark.asyncio
async def test_greedy_answers_are_the_int4_models_own_choices(llama_model_dir: Path) -> None:
    """Each token the scheduler chose is the int4 model's greedy choice after the tokens before
    it, as the model computes it alone (one row, transformers' forward). A row's linears never
    depend on its batch-mates, but a batch's padded attention can differ from a lone row's in
    the last bit (and the lean forward's norms, in the kernel, sum in their own order), and int8
    activations turn that into a visible step where a group's rounding flips: on random weights
    (nearly flat logits) that can swap a near tie. So a choice counts if it is the lone row's
    argmax or within ``NEAR_TIE`` of it; most must be the argmax."""
    engine = HFEngine(str(llama_model_dir), quantize="int4", num_threads=1)
    assert engine.info.details["quantize"] == "int4" and engine.info.details["load_streamed"] is True
    assert engine.info.details["weight_bytes"] > 0 and engine.info.details["load_s"] > 0
    engine.text.eos_token_ids = frozenset()
    service = InferenceService(ServiceConfig(speculative="off"), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    prompts = ["Attention lets every token look", "KV cache", "What is dynamic batching and why does it help?"]
    lengths = [12, 20, 9]
    streams = [await service.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(prompts, lengths, strict=True)]
    results = await asyncio.gather(*(s.result() for s in streams))
    await service.stop()
    assert max(r.batch_size for r in results) > 1  # they shared steps
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert len(result.token_ids) == n
        assert_own_greedy_choices(engine, prompt, list(result.token_ids))


def assert_own_greedy_choices(engine: HFEngine, prompt: str, chosen: list[int], exact: float = 0.9) -> None:
    """Each of ``chosen`` (greedy, after ``prompt``) is what ``engine``'s model, computing one
    row alone in transformers' forward, scores highest, or within ``NEAR_TIE`` of it; and a share
    ``exact`` of them exactly (the int4 path's check: see the test above)."""
    ids = engine.text.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = engine.model(torch.cat([ids, torch.tensor([chosen])], dim=1)).logits[0, ids.shape[1] - 1:-1]
    picked = logits.gather(-1, torch.tensor(chosen)[:, None])[:, 0]
    best = logits.max(-1).values
    assert (picked >= best - NEAR_TIE).all(), (prompt, chosen, (best - picked).max().item())
    assert (picked == best).float().mean() >= exact, (prompt, chosen)


def test_int4_is_refused_at_load_where_it_cannot_run(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "unavailable", lambda: "no C compiler was found (set CC)")
    with pytest.raises(ValueError, match="int4.*no C compiler"):
        HFEngine(str(tiny_model_dir), quantize="int4")
    with pytest.raises(ValueError, match="CPU weight format"):
        device_choice.check_quantize("int4", "cuda")


@pytest.mark.asyncio
async def test_a_server_asked_for_int4_where_it_cannot_run_stays_up_and_says_why(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "unavailable", lambda: "no C compiler was found (set CC)")
    await assert_failed_saying(ServiceConfig(engine="auto", model=str(tiny_model_dir), quantize="int4"),
                                    "no C compiler")


LOAD_PEAK = """
import json, sys, torch
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.cpu.process_memory import current_rss
from transformers import GPT2LMHeadModel  # noqa: F401 (its code: the runtime's memory, not the model's)
torch.ones(1) @ torch.ones(1)
before = current_rss()
lm, _, load = load_causal_lm(sys.argv[1], dtype=torch.float32, device="cpu", local_files_only=True,
                             quantize=sys.argv[2], prepack=True)
print(json.dumps({"before": before, "peak": load.peak_rss_bytes, "weights": load.weight_bytes,
                  "streamed": load.streamed, "after": load.rss_bytes}))
"""


@pytest.fixture(scope="module")
def small_model_dir(models_dir: Path) -> Path:
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "small", "small")


def _load_in_a_process(path: Path, quantize: str) -> dict:
    """Loaded in a fresh process started from this (big) one, as a server started by the bench
    or a hub's spawner is: its peak must be its own, not its parent's."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOAD_PEAK, str(path), quantize], capture_output=True, text=True,
                          timeout=240, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_loading_int4_never_holds_the_float32_model(small_model_dir: Path) -> None:
    """The 88M "small" model is 353 MB of float32 and ~70 MB in int4: loading it peaks near
    the latter (measured: +78 MB), where a load-then-quantize would pass +800 MB."""
    seen = _load_in_a_process(small_model_dir, "int4")
    assert seen["streamed"]
    float32_bytes = small_model_dir.joinpath("model.safetensors").stat().st_size
    assert seen["weights"] < float32_bytes / 4
    assert seen["peak"] - seen["before"] < 1.5 * seen["weights"] + 32 * 2**20, seen


@pytest.mark.slow
def test_a_float32_model_does_not_keep_its_checkpoint_file_resident(small_model_dir: Path) -> None:
    """Prepacking reads every page of the memory-mapped checkpoint; the map must not outlive
    the load (it held the whole file resident beside the packed copy: 2x the model). In our
    float32 blocks the load is streamed, and never holds both (loaded whole, the 0.5b shape
    peaked at 2.4x its resident size)."""
    seen = _load_in_a_process(small_model_dir, "none")
    assert seen["after"] - seen["before"] < 1.3 * seen["weights"] + 32 * 2**20, seen
    if kernels.unavailable() is None:
        assert seen["streamed"]
        assert seen["peak"] - seen["before"] < 1.5 * seen["weights"] + 32 * 2**20, seen
