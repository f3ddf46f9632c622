"""The Llama family's lean forward (engine/hf/llama_forward.py): taken only by the architectures it
implements, and what it computes is transformers' forward — greedy answers through the
scheduler (rows joining, leaving, mixing with prompts) equal ``generate`` on the same model in
float32; in int4 (q/k/v and gate/up one kernel call each, the norms in the kernel) every choice
is the model's own greedy one, near ties aside (``assert_own_greedy_choices``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_architectures import checkpoint
from test_hf_engine import LENGTHS, PROMPTS, run_with_late_joiners
from test_int4_linear import assert_own_greedy_choices
from transformers import AutoTokenizer

from jupyter_infer.cpu import int4_linear, kernels
from jupyter_infer.cpu.joint_linears import JointLinears
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.engine.hf.llama_forward import LlamaForward

needs_int4 = pytest.mark.skipif(kernels.unavailable() is not None, reason="no int4 kernel on this machine")


def _greedy(engine: HFEngine, prompt: str, n: int) -> list[int]:
    tok = AutoTokenizer.from_pretrained(engine.model.name_or_path)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=tok.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "quantize"), [("llama", "none"), ("llama", "int4"), ("qwen2", "int4"),
                                                 ("qwen3", "none"), ("qwen3", "int4"), ("llama", "int8")])
async def test_the_family_answers_as_transformers_does(kind: str, quantize: str, tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    if quantize != "none" and kernels.unavailable():
        pytest.skip("no int4 library on this machine")  # int8's norms, SwiGLU and attention are in it too
    # qwen2 has q/k/v biases, qwen3 per-head q/k norms; widths are multiples of int4's groups.
    folder = checkpoint(kind, tiny_model_dir, tmp_path / kind)
    engine = HFEngine(str(folder), dtype="float32", num_threads=1, quantize=quantize)
    assert isinstance(engine.llama_forward, LlamaForward)
    lean, calls = engine.llama_forward, []
    engine.llama_forward = lambda *args: calls.append(1) or lean(*args)
    results = await run_with_late_joiners(engine, "continuous")
    assert calls and results[3].batch_size > 2  # its steps ran here, and the late pair joined
    for result, prompt, n in zip(results, PROMPTS, LENGTHS, strict=True):
        # generate runs transformers' module tree on the same (quantized) weights
        if quantize == "none":
            assert list(result.token_ids) == _greedy(engine, prompt, n), (kind, quantize, prompt)
        else:
            assert len(result.token_ids) == n
            assert_own_greedy_choices(engine, prompt, list(result.token_ids), exact=0.9)
    shutil.rmtree(folder)


@pytest.mark.parametrize("kind", ["granite", "gemma", "phi3", "olmo2"])
def test_other_architectures_keep_transformers_forward(kind: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    # Granite scales its residuals, Gemma its norms and embeddings, Phi-3 fuses q/k/v, OLMo 2
    # norms after attention: each would be computed wrong by the lean forward.
    engine = HFEngine(str(checkpoint(kind, tiny_model_dir, tmp_path / kind)), dtype="float32", num_threads=1)
    assert engine.ragged and engine.llama_forward is None
    assert engine.info.details["forward"] == "transformers' modules, every bucket in one forward"


def test_a_variant_whose_probe_disagrees_keeps_transformers_forward(llama_model_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A Llama whose layers compute something this forward does not (as a variant with an
    # extra multiplier would): the probe at load compares logits and refuses it.
    from transformers.models.llama import modeling_llama

    plain = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", lambda self, x: 1.5 * plain(self, x))
    assert HFEngine(str(llama_model_dir), dtype="float32", num_threads=1).llama_forward is None


@needs_int4
def test_joint_int4_linears_equal_each_linear_and_add_into_a_residual() -> None:
    torch.manual_seed(0)
    linears = [int4_linear.Int4Linear.from_weight(torch.randn(n, 96), torch.randn(n) if n == 40 else None)
               for n in (48, 40, 16)]
    joint = JointLinears(linears)
    x = torch.randn(3, 96)
    assert torch.equal(joint(x), torch.cat([lin(x) for lin in linears], dim=-1))
    residual = torch.randn(3, 104)
    expected = residual + joint(x)
    assert joint(x, into=residual) is residual
    torch.testing.assert_close(residual, expected)
    with pytest.raises(ValueError, match="adds into 3 rows of 104"):  # the kernel writes raw memory
        joint(x, into=torch.zeros(3, 50))


@needs_int4
def test_joint_int4_linears_read_a_strided_input_as_its_values() -> None:
    # The kernel reads raw memory: a transposed (non-contiguous) input must not be read as laid out.
    torch.manual_seed(1)
    joint = JointLinears([int4_linear.Int4Linear.from_weight(torch.randn(32, 64), None)])
    x = torch.randn(64, 3).t()
    assert not x.is_contiguous()
    assert torch.equal(joint(x), joint(x.contiguous()))


@needs_int4
def test_a_long_prompt_attends_in_bfloat16_as_transformers_forward_does_whole_or_in_steps(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Heads of 64 dims (the kernel's multiple), int4: a prompt of 256 tokens or more attends in C.
    from transformers import AutoConfig, AutoModelForCausalLM

    from jupyter_infer.cpu import layer_ops
    from jupyter_infer.cpu.features import cpu_flags
    from jupyter_infer.engine.hf import llama_forward
    from jupyter_infer.engine.hf.ragged import Block, forward
    from jupyter_infer.engine.kv.kv_cache import new_cache

    folder = tmp_path / "llama64"
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=len(AutoTokenizer.from_pretrained(folder)), hidden_size=128,
                                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, max_position_embeddings=1024)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    engine = HFEngine(str(folder), dtype="float32", num_threads=1, quantize="int4")
    lean = engine.llama_forward
    assert lean.prompt_in_c == ("avx512_bf16" in cpu_flags())
    if not lean.prompt_in_c:
        pytest.skip("no bfloat16 dot on this CPU: prompts attend through SDPA")
    calls, attend = [], layer_ops.attend_prompt
    monkeypatch.setattr(llama_forward.layer_ops, "attend_prompt", lambda *args: calls.append(args[0].shape[0]) or attend(*args))
    ids = torch.randint(5, config.vocab_size, (1, 600), generator=torch.Generator().manual_seed(1))

    def logits(*steps: int) -> torch.Tensor:
        cache, done, out = new_cache(config), 0, None
        for width in steps:
            block = Block(cache, ids[:, done : done + width], torch.ones(1, done + width, dtype=torch.long),
                          torch.arange(done, done + width)[None])
            out = forward(engine.model, [block], lean=lean)
            done += width
        return out[0]

    with torch.inference_mode():
        whole, in_steps, short = logits(600), logits(300, 300), logits(200, 400)
        theirs = engine.model(ids).logits[0, -1]  # transformers' modules, float32 SDPA, the same int4 weights
    assert calls == [600] * 2 + [300] * 4 + [400] * 2  # 2 layers a step; the 200-token step is SDPA's
    for ours in (whole, in_steps, short):
        assert ours.argmax() == theirs.argmax()
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0.03 * float(theirs.abs().max()))
