"""The hf engine on locally built models: exactness against ``model.generate``, rows that
join and leave, sampling with seeds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.engine import EngineConfig, load_engine
from jupyter_infer.engine.base import StepPlan
from jupyter_infer.engine.hf import HFEngine, cpu_has_native_bf16
from jupyter_infer.request import Request, SamplingParams
from jupyter_infer.scheduler import Scheduler, SchedulerConfig
from jupyter_infer.sequence import Sequence

PROMPTS = [
    "Attention lets every token look at the others",
    "KV cache",
    "What is dynamic batching and why does it help throughput on a busy server?",
    "agents",
    "Retrieval augmented generation combines search with",
]
LENGTHS = [20, 7, 33, 12, 25]


def reference(model_dir: Path, prompt: str, n: int) -> list[int]:
    """Per-request greedy ``generate``, no padding, EOS ignored."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=tok.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


async def run_with_late_joiners(engine: HFEngine, mode: str) -> list[Sequence]:
    engine.eos_token_ids = frozenset()  # every request runs to its own max_tokens
    s = Scheduler(engine, SchedulerConfig(mode=mode, batch_window_ms=5))
    s.start()
    await s.wait_ready()
    streams = [await s.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(PROMPTS[:3], LENGTHS[:3], strict=True)]
    for _ in range(30):  # until the first three are decoding
        if all(st.seq.output_ids for st in streams):
            break
        await asyncio.sleep(0.005)
    streams += [await s.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(PROMPTS[3:], LENGTHS[3:], strict=True)]
    await asyncio.gather(*(st.result() for st in streams))
    await s.stop()
    return [st.seq for st in streams]


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["continuous", "window"])
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_greedy_equals_generate_with_late_joiners(request, model_fixture: str, mode: str) -> None:
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    seqs = await run_with_late_joiners(engine, mode)
    if mode == "continuous":
        # The late pair really joined a batch already running, not a fresh one.
        assert seqs[3].batch_id != seqs[0].batch_id and seqs[3].batch_size > 2
    for seq, prompt, n in zip(seqs, PROMPTS, LENGTHS, strict=True):
        assert seq.output_ids == reference(model_dir, prompt, n), prompt


def _seq(engine: HFEngine, prompt: str, n: int) -> Sequence:
    return Sequence(Request(prompt, SamplingParams(max_tokens=n)), engine.tokenize(prompt))


def test_rows_leave_at_the_next_step_and_cache_stays_consistent(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    seqs = [_seq(engine, p, 10) for p in PROMPTS[:3]]
    for seq, tok in zip(seqs, engine.step(StepPlan(1, "prefill", seqs)), strict=True):
        seq.output_ids.append(tok)
    for seq, tok in zip(seqs, engine.step(StepPlan(2, "decode", seqs)), strict=True):
        seq.output_ids.append(tok)
    # The longest prompt leaves: its padding columns go with it.
    longest = max(seqs, key=lambda s: s.num_prompt_tokens)
    rest = [s for s in seqs if s is not longest]
    for seq, tok in zip(rest, engine.step(StepPlan(3, "decode", rest, release=[longest.id])), strict=True):
        seq.output_ids.append(tok)
    batch = engine._batch
    assert engine.num_running == 2 and batch.ids == [s.id for s in rest]
    width = max(s.num_prompt_tokens for s in rest) + 2  # prompt + the two tokens fed back so far
    assert batch.mask.shape == (2, width)
    for layer in batch.cache.layers:
        assert layer.keys.shape[0] == 2 and layer.keys.shape[2] == width
    for _ in range(7):
        for seq, tok in zip(rest, engine.step(StepPlan(4, "decode", rest)), strict=True):
            seq.output_ids.append(tok)
    for seq in rest:
        assert seq.output_ids == reference(tiny_model_dir, seq.request.prompt, 10)
    engine.release([s.id for s in rest])
    assert engine.num_running == 0


def test_decode_that_does_not_match_the_batch_is_refused(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    a, b = _seq(engine, "one", 4), _seq(engine, "two", 4)
    engine.step(StepPlan(1, "prefill", [a]))
    with pytest.raises(RuntimeError, match="does not match"):
        engine.step(StepPlan(2, "decode", [a, b]))


@pytest.mark.asyncio
async def test_seeded_sampling_is_independent_of_batch_mates(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.eos_token_ids = frozenset()
    s = Scheduler(engine, SchedulerConfig())
    s.start()
    await s.wait_ready()
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    alone = await (await s.submit(Request("sampling test", params))).result()
    crowd = [await s.submit(Request(p, SamplingParams(max_tokens=12, temperature=1.0))) for p in PROMPTS]
    again = await s.submit(Request("sampling test", params))
    results = await asyncio.gather(again.result(), *(c.result() for c in crowd))
    assert results[0].text == alone.text and again.seq.batch_size > 1
    await s.stop()


@pytest.mark.asyncio
async def test_continuous_priority_newcomer_admitted_before_older_low_priority(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.eos_token_ids = frozenset()
    s = Scheduler(engine, SchedulerConfig(mode="continuous", max_batch_size=1))
    s.start()
    await s.wait_ready()
    running = await s.submit(Request("long running", SamplingParams(max_tokens=40)))
    while not running.seq.output_ids:
        await asyncio.sleep(0.002)
    low = [await s.submit(Request(f"low {i}", SamplingParams(max_tokens=2))) for i in range(2)]
    high = await s.submit(Request("urgent", SamplingParams(max_tokens=2), priority=10))
    await asyncio.gather(running.result(), high.result(), *(x.result() for x in low))
    assert high.seq.admitted_at < low[0].seq.admitted_at < low[1].seq.admitted_at
    await s.stop()


def test_auto_falls_back_to_simulated_offline_with_the_reason(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = load_engine(EngineConfig(engine="auto", model="sshleifer/tiny-gpt2"))
    assert engine.info.engine == "simulated"
    assert "sshleifer/tiny-gpt2" in engine.info.fallback_reason


def test_hf_engine_requested_explicitly_raises_instead_of_falling_back(tmp_path: Path) -> None:
    with pytest.raises(Exception):  # noqa: B017 - whatever transformers raises for a bad folder
        load_engine(EngineConfig(engine="hf", model=str(tmp_path)))


def test_auto_loads_a_local_model_folder(tiny_model_dir: Path) -> None:
    engine = load_engine(EngineConfig(engine="auto", model=str(tiny_model_dir), num_threads=1))
    assert engine.info.engine == "hf" and engine.info.fallback_reason is None
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert engine.info.device == "cpu" and engine.info.dtype == expected
    assert engine.info.details["architecture"] == "GPT2LMHeadModel"


def test_decode_writes_into_the_cache_buffer_instead_of_copying_it(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    seqs = [_seq(engine, p, 10) for p in PROMPTS[:2]]
    engine.step(StepPlan(1, "prefill", seqs))
    engine.step(StepPlan(2, "decode", seqs))
    layer = engine._batch.cache.layers[0]
    buffer = layer._key_buf.data_ptr()
    for step in range(3, 8):
        engine.step(StepPlan(step, "decode", seqs))
    assert layer._key_buf.data_ptr() == buffer
    assert layer.keys.shape[2] == engine._batch.mask.shape[1]  # one column per token fed so far
