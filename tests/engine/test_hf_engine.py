"""The hf engine on locally built models: exactness against ``model.generate``, rows that
join and leave, sampling with seeds."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_steps import keeping
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.engine import RowOutput, StepPlan, load_engine
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.engine.kv import kv_cache
from jupyter_infer.formats.device_choice import cpu_has_native_bf16, pick_device
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, RequestResult, SamplingParams
from jupyter_infer.values.sequence import Sequence

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


async def started(engine: HFEngine, **config) -> InferenceService:
    service = InferenceService(ServiceConfig(**config), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    return service


async def run_with_late_joiners(engine: HFEngine, mode: str) -> list[RequestResult]:
    engine.text.eos_token_ids = frozenset()  # every request runs to its own max_tokens
    s = await started(engine, mode=mode, batch_window_ms=5)
    streams = [await s.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(PROMPTS[:3], LENGTHS[:3], strict=True)]
    for _ in range(60):  # until the first three are decoding
        if s.collector.ttft_ms.count == 3:
            break
        await asyncio.sleep(0.005)
    streams += [await s.submit(Request(p, SamplingParams(max_tokens=n))) for p, n in zip(PROMPTS[3:], LENGTHS[3:], strict=True)]
    results = await asyncio.gather(*(st.result() for st in streams))
    await s.stop()
    return results


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["continuous", "window"])
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_greedy_equals_generate_with_late_joiners(request, model_fixture: str, mode: str) -> None:
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    results = await run_with_late_joiners(engine, mode)
    if mode == "continuous":
        # The late pair really joined a batch already running, not a fresh one.
        assert results[3].batch_id != results[0].batch_id and results[3].batch_size > 2
    for result, prompt, n in zip(results, PROMPTS, LENGTHS, strict=True):
        assert list(result.token_ids) == reference(model_dir, prompt, n), prompt


def _seq(engine: HFEngine, prompt: str, n: int) -> Sequence:
    return Sequence(Request(prompt, SamplingParams(max_tokens=n)), engine.text.tokenize(prompt))


def step(engine: HFEngine, step_id: int, seqs: list[Sequence], keep: Iterable[str] = (), **more: Any):
    """Run a plan of ``seqs`` after which only the rows in ``keep`` stay (``keeping``), append
    each row's tokens; the engine's decoding rows after the step."""
    sampled = engine.execute(keeping(engine, step_id, seqs, keep, **more))
    for seq, output in zip(seqs, sampled, strict=True):
        seq.output_ids += output.tokens
    return engine.decoding_buckets()


def prefill(engine: HFEngine, seqs: list[Sequence]):
    """The newcomers' first tokens (every other row gone), and their batch."""
    sampled = engine.execute(keeping(engine, 0, seqs))
    return sampled, dense(engine.decoding_buckets())


def dense(buckets):
    """The one dense bucket of the decoding rows (rows of similar lengths share one)."""
    [only] = buckets
    return only


def ids(seqs: list[Sequence]) -> list[str]:
    return [s.id for s in seqs]


def test_rows_leave_at_the_next_step_and_cache_stays_consistent(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    seqs = [_seq(engine, p, 10) for p in PROMPTS[:3]]
    batch = step(engine, 1, seqs)
    batch = step(engine, 2, seqs, ids(seqs))
    # The longest prompt leaves: its padding columns go with it.
    longest = max(seqs, key=lambda s: s.num_prompt_tokens)
    rest = [s for s in seqs if s is not longest]
    batch = step(engine, 3, rest, ids(rest))
    assert engine.held_rows().decoding == ids(rest) and len(dense(batch).rows) == 2
    width = max(s.num_prompt_tokens for s in rest) + 2  # prompt + the two tokens fed back so far
    assert dense(batch).mask.shape == (2, width)
    for layer in dense(batch).cache.layers:
        assert layer.keys.shape[0] == 2 and layer.keys.shape[2] == width
    for _ in range(7):
        batch = step(engine, 4, rest, ids(rest))
    for seq in rest:
        assert seq.output_ids == reference(tiny_model_dir, seq.request.prompt, 10)
    engine.execute(keeping(engine, 5, []))  # the last rows leave: nothing runs
    assert engine.decoding_buckets() == [] and engine.held_rows().ids == []


def test_a_newcomer_joins_rows_that_stay_after_others_left(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    a, b, c = (_seq(engine, p, 8) for p in PROMPTS[:3])
    step(engine, 1, [a, b], [])
    step(engine, 2, [a, b], ids([a, b]))
    # b left before c's prefill: the plan keeps only a, and c joins after it.
    step(engine, 3, [c], [a.id])
    assert engine.held_rows().decoding == ids([a, c])
    for n in range(4, 10):
        step(engine, n, [a, c], ids([a, c]))
    for seq in (a, c):
        assert seq.output_ids == reference(tiny_model_dir, seq.request.prompt, len(seq.output_ids))


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
def test_newcomers_and_a_chunked_prompt_ride_in_the_decoding_rows_forward_exactly(request, model_fixture: str) -> None:
    """Mixed steps (issue 30): decoding rows beside newcomers' whole prompts, then beside a
    long prompt's chunks, one forward a step, and every row's greedy tokens those ``generate``
    gives it alone."""
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    forwards: list[int] = []  # the embedding runs once a forward, transformers' or the Llama family's lean one
    engine.model.get_input_embeddings().register_forward_pre_hook(lambda *_: forwards.append(1))
    a, b, c, long_ = (_seq(engine, p, 12) for p in (*PROMPTS[:3], " ".join(PROMPTS)))

    def run(plan: StepPlan) -> None:
        sampled = engine.execute(plan)
        seqs = [next(x for x in (a, b, c, long_) if x.id == i) for i in plan.ids]
        for row, (seq, tokens) in enumerate(zip(seqs, [o.tokens for o in sampled], strict=True)):
            if plan.prompt[row]:
                seq.num_computed = len(seq.prompt_ids) if tokens else sampled[row].computed
            seq.output_ids += tokens

    run(keeping(engine, 1, [a]))
    forwards.clear()
    plan = keeping(engine, 2, [a, b, c], [a.id])
    run(plan)
    assert plan.kind == "mixed" and len(forwards) == 1  # a's bucket and the newcomers' block, one forward
    assert [len(x.output_ids) for x in (a, b, c)] == [2, 1, 1]
    chunks = 0
    while not long_.output_ids:  # a chunk of 16 a step beside the three decoding rows
        forwards.clear()
        plan = keeping(engine, 3 + chunks, [a, b, c, long_], ids([a, b, c]) + [long_.id] * bool(long_.num_computed),
                        [1, 1, 1, 16])
        run(plan)
        assert plan.kind == "mixed" and plan.chunk == 16 and len(forwards) == 1
        chunks += 1
    assert chunks == -(-len(long_.prompt_ids) // 16) > 1
    live = [a, b, c, long_]
    while live:
        run(keeping(engine, 99, live, ids(live)))
        live = [x for x in live if len(x.output_ids) < 12]
    for seq in (a, b, c, long_):
        assert seq.output_ids[:12] == reference(model_dir, seq.request.prompt, 12), seq.request.prompt


@pytest.mark.asyncio
async def test_seeded_sampling_is_independent_of_batch_mates(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    s = await started(engine)
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    alone = await (await s.submit(Request("sampling test", params))).result()
    crowd = [await s.submit(Request(p, SamplingParams(max_tokens=12, temperature=1.0))) for p in PROMPTS]
    again = await s.submit(Request("sampling test", params))
    results = await asyncio.gather(again.result(), *(c.result() for c in crowd))
    assert results[0].text == alone.text and results[0].batch_size > 1
    await s.stop()


@pytest.mark.asyncio
async def test_continuous_priority_newcomer_admitted_before_older_low_priority(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    s = await started(engine, mode="continuous", max_batch_size=1)
    running = await s.submit(Request("long running", SamplingParams(max_tokens=40)))
    while not s.collector.ttft_ms.count:
        await asyncio.sleep(0.002)
    low = [await s.submit(Request(f"low {i}", SamplingParams(max_tokens=2))) for i in range(2)]
    high = await s.submit(Request("urgent", SamplingParams(max_tokens=2), priority=10))
    await asyncio.gather(running.result(), high.result(), *(x.result() for x in low))
    admitted = {r["id"]: r["admitted_at"] for r in s.batches()["requests"]}
    assert admitted[high.id] < admitted[low[0].id] < admitted[low[1].id]
    await s.stop()


def test_auto_falls_back_to_simulated_offline_with_the_reason(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = load_engine(ServiceConfig(engine="auto", model="sshleifer/tiny-gpt2"))
    assert engine.info.engine == "simulated"
    assert "sshleifer/tiny-gpt2" in engine.info.fallback_reason


def test_hf_engine_requested_explicitly_raises_instead_of_falling_back(tmp_path: Path) -> None:
    # Whatever transformers raises for a folder with no model in it reaches the caller.
    with pytest.raises((OSError, ValueError)):
        load_engine(ServiceConfig(engine="hf", model=str(tmp_path)))


def test_auto_loads_a_local_model_folder(tiny_model_dir: Path) -> None:
    engine = load_engine(ServiceConfig(engine="auto", model=str(tiny_model_dir), num_threads=1))
    assert engine.info.engine == "hf" and engine.info.fallback_reason is None
    device = pick_device()
    assert engine.info.device == device
    if device == "cpu":
        assert engine.info.dtype == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert engine.info.details["architecture"] == "GPT2LMHeadModel"


def test_decode_writes_into_the_cache_buffer_instead_of_copying_it(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    seqs = [_seq(engine, p, 10) for p in PROMPTS[:2]]
    batch = step(engine, 1, seqs)
    batch = step(engine, 2, seqs, ids(seqs))
    layer = dense(batch).cache.layers[0]
    buffers = layer.keys.data_ptr(), dense(batch).mask.data_ptr()
    for n in range(3, 8):
        batch = step(engine, n, seqs, ids(seqs))
    # Keys, values and the mask grow in place: a decode step copies neither.
    assert (layer.keys.data_ptr(), dense(batch).mask.data_ptr()) == buffers
    assert layer.keys.shape[2] == dense(batch).mask.shape[1]  # one column per token fed so far


# -- prefix caching and chunked prefill: the same greedy tokens --------------------------------
SYSTEM = ("You are a careful research assistant inside a notebook. Answer briefly, say which "
          "sources you used, and say so when you do not know. Tools: search, calculator, notes. ")
AGENT_TASKS = ["Reflect on the question: what is a KV cache?", "Plan a tool call for batching",
               "Synthesize what agents share"]


@functools.cache
def reference_cached(model_dir: Path, prompt: str, n: int) -> tuple[int, ...]:
    return tuple(reference(model_dir, prompt, n))


@pytest.mark.asyncio
@pytest.mark.parametrize(("cache_mb", "chunk"), [(64, 0), (64, 16), (0, 16)])
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_prefix_cache_and_chunks_keep_greedy_outputs_exact(request, model_fixture: str, cache_mb: float,
                                                                 chunk: int) -> None:
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1, prefix_cache_mb=cache_mb)
    engine.text.eos_token_ids = frozenset()
    s = await started(engine, prefill_chunk_tokens=chunk, idle_admit_delay_ms=0)
    first = [SYSTEM + task for task in AGENT_TASKS]
    streams = [await s.submit(Request(p, SamplingParams(max_tokens=12))) for p in first]
    while s.collector.ttft_ms.count < 1:  # the first round is decoding
        await asyncio.sleep(0.005)
    # Late joiners: the next round of two agents, each its prompt so far plus more (a history).
    later = [first[0] + " The cache keeps keys and values.", first[1] + " Tool: search(batching)."]
    streams += [await s.submit(Request(p, SamplingParams(max_tokens=8))) for p in later]
    results = await asyncio.gather(*(st.result() for st in streams))
    stats = s.metrics()["prefix_cache"]
    await s.stop()
    for result, prompt in zip(results, first + later, strict=True):
        assert result.token_ids == reference_cached(model_dir, prompt, len(result.token_ids)), prompt
    if cache_mb:
        assert stats["hits"] >= 2 and stats["reused_tokens"] >= 2 * 16, stats
    else:
        assert stats == {"enabled": False, "reason": "off (prefix_cache_mb = 0)"}


@pytest.mark.asyncio
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_a_long_prompt_alone_goes_a_step_at_a_time_and_answers_exactly(request, model_fixture: str) -> None:
    """Nothing else runs, but the prompt is longer than the engine's prefill_step_tokens: it
    is computed that many tokens a forward (its memory bounded), with the same answer."""
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    assert engine.prefill_step_tokens == 4096  # on the CPU
    engine.prefill_step_tokens = 16
    forwards: list[int] = []
    embed = engine.model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda module, args, out: forwards.append(args[0].numel()))
    s = await started(engine, idle_admit_delay_ms=0)
    prompt = SYSTEM + AGENT_TASKS[0]
    result = await (await s.submit(Request(prompt, SamplingParams(max_tokens=6)))).result()
    await s.stop()
    handle.remove()
    n = len(engine.text.tokenize(prompt))
    assert n > 32 and forwards[: -(-n // 16)] == [16] * (n // 16) + ([n % 16] if n % 16 else [])
    assert result.token_ids == reference_cached(model_dir, prompt, 6)


def test_prefix_cache_reuses_blocks_and_stays_within_its_budget(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, prefix_cache_mb=1)
    a = _seq(engine, SYSTEM + AGENT_TASKS[0], 4)
    prefill(engine, [a])
    stats = engine.prefix_cache_stats()
    block_mb = stats["used_mb"] / stats["blocks"]
    assert stats["blocks"] == a.num_prompt_tokens // 16 and stats["misses"] == 1
    b = _seq(engine, SYSTEM + AGENT_TASKS[1], 4)
    prefill(engine, [b])
    stats = engine.prefix_cache_stats()
    shared = len(os.path.commonprefix([a.prompt_ids, b.prompt_ids])) // 16
    assert stats["hits"] == 1 and stats["reused_tokens"] == 16 * shared
    # Many different prompts later, the memory stays within the budget: old blocks left.
    for i in range(40):
        prefill(engine, [_seq(engine, f"{i} " + SYSTEM * 2, 1)])
    stats = engine.prefix_cache_stats()
    assert stats["used_mb"] <= 1 and stats["evicted_blocks"] > 0
    assert stats["used_mb"] == pytest.approx(stats["blocks"] * block_mb, rel=0.01)


def _real_kv(buckets, row_id: str) -> list[torch.Tensor]:
    """One row's keys and values in its real (unmasked) columns, every layer: the shared
    prefix it starts with (if any), then its own."""
    bucket = next(b for b in buckets if row_id in b.ids)
    row, kv = bucket.ids.index(row_id), []
    cols = bucket.mask[row].bool()
    for i, layer in enumerate(bucket.cache.layers):
        own = (layer.keys[row][:, cols], layer.values[row][:, cols])
        shared = bucket.shared.layer(i) if bucket.shared is not None else None
        kv += own if shared is None else [torch.cat([s[0], t], dim=1) for s, t in zip(shared, own, strict=True)]
    return kv


def _position(buckets, row_id: str) -> int:
    bucket = next(b for b in buckets if row_id in b.ids)
    return int(bucket.positions[bucket.ids.index(row_id)])


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
def test_cached_and_chunked_prefills_build_the_kv_of_a_cold_one(request, model_fixture: str) -> None:
    # Greedy tokens of these random-weight models hardly depend on positions (Llama's RoPE
    # moves its logits by ~1e-2 when positions are off by 32): compare the KV itself.
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    prompt, short = SYSTEM + AGENT_TASKS[1], "agents"
    cold_seqs = [_seq(engine, prompt, 1), _seq(engine, short, 1)]
    cold_tokens = engine.execute(keeping(engine, 0, cold_seqs))
    engine.configure_prefix_cache(64)
    # The system prompt, cached, and still running: the rows below share it with this one.
    running = _seq(engine, SYSTEM + AGENT_TASKS[0], 1)
    engine.execute(keeping(engine, 0, [running], ids(cold_seqs)))
    hot_seqs = [_seq(engine, prompt, 1), _seq(engine, short, 1)]
    hot_tokens = engine.execute(keeping(engine, 0, hot_seqs, ids([*cold_seqs, running])))
    assert engine.prefix_cache_stats()["reused_tokens"] >= 32
    seq, first = _seq(engine, prompt, 1), RowOutput()
    held = ids([*cold_seqs, running, *hot_seqs])
    while not first.tokens:  # 16 tokens a step, continuing the row, until the prompt is in
        [first] = engine.execute(keeping(engine, 1, [seq], held + [seq.id] * bool(seq.num_computed), [16]))
        seq.num_computed = first.computed if first.computed is not None else seq.num_prompt_tokens
    assert engine.prefix_cache_stats()["reused_tokens"] > seq.num_prompt_tokens  # all but a block
    assert [o.tokens for o in hot_tokens] == [o.tokens for o in cold_tokens] and first.tokens == cold_tokens[0].tokens
    # The cached start is shared, not copied: the hot row and the chunked one refer to one prefix.
    buckets = engine.decoding_buckets()
    [hot_prefix] = {id(b.shared) for b in buckets if b.shared is not None and set(b.ids) & set(ids(hot_seqs))}
    assert [id(b.shared) for b in buckets if seq.id in b.ids] == [hot_prefix]
    pairs = [(h.id, c.id) for h, c in zip(hot_seqs, cold_seqs, strict=True)]
    for row_id, cold_id in [*pairs, (seq.id, cold_seqs[0].id)]:
        assert _position(buckets, row_id) == _position(buckets, cold_id)
        for a, b in zip(_real_kv(buckets, row_id), _real_kv(buckets, cold_id), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
def test_rows_after_a_cached_system_prompt_hold_it_once_and_decode_exactly(request, model_fixture: str) -> None:
    """Agents whose prompts start with a cached system prompt that a running row holds refer
    to one copy of it (the KV held counts it once); their greedy tokens are generate's,
    joining late and leaving included (GPT-2, and Llama's grouped-query heads)."""
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    engine.configure_prefix_cache(64)
    first = _seq(engine, SYSTEM * 2 + "Begin.", 16)
    batch = step(engine, 0, [first])  # caches the system prompt, and runs
    agents = [_seq(engine, SYSTEM * 2 + task, 8) for task in AGENT_TASKS]
    plain = _seq(engine, PROMPTS[0], 8)
    batch = step(engine, 1, [agents[0], plain, agents[1]], [first.id])
    everyone = [first, agents[0], plain, agents[1]]
    batch = step(engine, 2, everyone, ids(everyone))
    batch = step(engine, 3, [agents[2]], ids(everyone))  # joins late
    everyone.append(agents[2])
    [prefix] = {b.shared.root for b in batch if b.shared is not None}
    assert {i for b in batch if b.shared is not None for i in b.ids} == set(ids(agents))
    usage = engine.kv_usage()
    own = sum(int(b.mask.sum()) for b in batch)
    assert usage.tokens_held == prefix.length + own  # the prefix counted once, not three times
    spare = len(batch) * kv_cache.SPARE_COLUMNS * len(everyone)
    assert usage.bytes_held <= (prefix.length + own + spare) * usage.bytes_per_token
    for n in range(4, 8):
        batch = step(engine, n, everyone, ids(everyone))
    for n in range(8, 10):  # the first row and the first agent leave
        batch = step(engine, n, everyone[2:], ids(everyone[2:]))
    for seq in everyone:
        assert seq.output_ids == reference(model_dir, seq.request.prompt, len(seq.output_ids)), seq.request.prompt


@pytest.mark.asyncio
async def test_agents_sending_one_system_prompt_at_once_hold_it_once_in_the_service(tiny_model_dir: Path) -> None:
    """Through the service: while the first agent runs, the others' rows refer to its cached
    system prompt; ``kv_cache`` says how many tokens are held once for several rows, and every
    answer is still generate's."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, prefix_cache_mb=64)
    engine.text.eos_token_ids = frozenset()
    s = await started(engine, idle_admit_delay_ms=0)
    prompts = [SYSTEM * 2 + task for task in AGENT_TASKS]
    first = await s.submit(Request(prompts[0], SamplingParams(max_tokens=60)))
    for _ in range(400):  # until the first agent decodes (its prompt is cached by then)
        if s.collector.ttft_ms.count:
            break
        await asyncio.sleep(0.005)
    others = [await s.submit(Request(p, SamplingParams(max_tokens=12))) for p in prompts[1:]]
    shared = []
    while not all(st.done for st in others):
        usage = s.kv_cache()
        shared.append(usage["shared_tokens"] if usage else 0)
        await asyncio.sleep(0.002)
    results = [await st.result() for st in [first, *others]]
    await s.stop()
    assert max(shared) >= 64  # the system prompt's whole blocks, once for both late agents
    for prompt, result in zip(prompts, results, strict=True):
        assert list(result.token_ids) == reference(tiny_model_dir, prompt, len(result.token_ids))


def test_rows_that_ask_for_few_tokens_get_no_more_room_than_they_can_use(tiny_model_dir: Path) -> None:
    """Spare columns are allocated ahead so that a decode step writes in place; a row that can
    generate 5 more tokens gets room for 5, not 64 (the agents' KV overhead), and still equals
    generate when it grows past it."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    few, many = _seq(engine, PROMPTS[0], 5), _seq(engine, PROMPTS[1], 100)
    batch = step(engine, 1, [few])
    layer = dense(batch).cache.layers[0]
    assert layer.capacity - layer.keys.shape[2] <= 5
    batch = step(engine, 2, [many], [few.id])  # joins: room for the most
    layer = dense(batch).cache.layers[0]
    assert layer.capacity - layer.keys.shape[2] == kv_cache.SPARE_COLUMNS
    for n in range(3, 7):
        batch = step(engine, n, [few, many], ids([few, many]))
    for n in range(7, 80):  # few leaves; past the first allocation's room: it grows, and stays exact
        batch = step(engine, n, [many], [many.id])
    for seq in (few, many):
        assert seq.output_ids == reference(tiny_model_dir, seq.request.prompt, len(seq.output_ids))


def test_rows_joining_and_leaving_leave_room_for_the_next_decode(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    a, b, c = (_seq(engine, p, 8) for p in PROMPTS[:3])
    batch = step(engine, 1, [a, b])
    batch = step(engine, 2, [c], ids([a, b]))  # c joins
    layer = dense(batch).cache.layers[0]
    merged = layer.keys.data_ptr()
    batch = step(engine, 3, [a, b, c], ids([a, b, c]))
    # The join wrote into a buffer with spare room: the decode after it copied nothing.
    assert layer.keys.data_ptr() == merged
    engine.execute(keeping(engine, 0, [], ids([a, c])))  # b leaves (a plan that only frees its row)
    kept = layer.keys.data_ptr()
    batch = step(engine, 4, [a, c], ids([a, c]))
    assert layer.keys.data_ptr() == kept and layer.keys.shape[2] == dense(batch).mask.shape[1]
    for seq in (a, c):
        assert seq.output_ids == reference(tiny_model_dir, seq.request.prompt, len(seq.output_ids))


@pytest.mark.asyncio
async def test_greedy_logprobs_are_the_models_log_softmax(tiny_model_dir: Path) -> None:
    """Decode and echoed-prompt logprobs equal log_softmax of the model's own logits for the
    same tokens, for rows of different lengths in one batch (left padding included)."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    s = await started(engine, mode="window", batch_window_ms=50)
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=4, prompt_logprobs=4)
    streams = [await s.submit(Request(p, params)) for p in PROMPTS[:3]]
    plain = await s.submit(Request(PROMPTS[3], SamplingParams(max_tokens=6)))
    results = await asyncio.gather(*(x.result() for x in streams))
    assert (await plain.result()).logprobs is None  # rows that did not ask carry nothing
    assert len({result.batch_id for result in results}) == 1  # one padded batch
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for result in results:
        tokens = list(result.prompt_ids) + list(result.token_ids)
        with torch.no_grad():
            expected = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), -1)
        got = [None if r is None else r.logprob for r in result.prompt_logprobs] + [r.logprob for r in result.logprobs]
        assert got[0] is None and len(got) == len(tokens)
        want = [float(expected[i - 1, t]) for i, t in enumerate(tokens) if i > 0]
        assert got[1:] == pytest.approx(want, abs=1e-4)
        for i, record in enumerate(result.logprobs, start=len(result.prompt_ids)):
            top = expected[i - 1].topk(4)
            assert [t for t, _ in record.top] == top.indices.tolist()
            assert record.token_id == top.indices[0]  # greedy: the chosen one is the most likely
    await s.stop()


@pytest.mark.asyncio
async def test_logit_bias_min_tokens_and_ignore_eos_on_the_real_engine(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    eos = min(engine.text.eos_token_ids)
    s = await started(engine)

    async def run(**params) -> RequestResult:
        return await (await s.submit(Request("hello there", SamplingParams(max_tokens=8, **params)))).result()

    assert (await run(logit_bias=((eos, 100.0),))).completion_tokens == 0  # EOS at once
    assert (await run(logit_bias=((eos, 100.0),), min_tokens=3)).completion_tokens == 3
    forced = await run(logit_bias=((eos, 100.0),), ignore_eos=True)
    assert forced.completion_tokens == 8 and set(forced.token_ids) == {eos}
    free = await run(ignore_eos=True)
    penalised = await run(ignore_eos=True, repetition_penalty=5.0, frequency_penalty=2.0)
    assert len(set(penalised.token_ids)) >= len(set(free.token_ids))
    await s.stop()


@pytest.mark.asyncio
async def test_echoed_prompt_logprobs_bypass_the_prefix_cache_and_chunks(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1, prefix_cache_mb=64)
    s = await started(engine, prefill_chunk_tokens=16, idle_admit_delay_ms=0)
    prompt = SYSTEM + AGENT_TASKS[0]
    await (await s.submit(Request(prompt, SamplingParams(max_tokens=1)))).result()  # now cached
    echo = await (await s.submit(Request(prompt, SamplingParams(max_tokens=1, prompt_logprobs=1)))).result()
    await s.stop()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([list(echo.prompt_ids)])).logits[0], -1)
    got = [r.logprob for r in echo.prompt_logprobs[1:]]
    assert len(got) == len(echo.prompt_ids) - 1 > 16  # every position, though cached and long
    assert got == pytest.approx([float(expected[i - 1, t]) for i, t in enumerate(echo.prompt_ids) if i], abs=1e-4)


def test_the_engine_reports_the_kv_memory_its_rows_hold(tiny_model_dir: Path) -> None:
    """Bytes held (buffers, padding and spare room included), real tokens, and their ratio:
    a long prompt beside a short one makes the dense layout pad the short row to its length;
    when the long one leaves, its columns go."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    config = engine.model.config
    per_token = 2 * config.n_layer * config.n_head * (config.n_embd // config.n_head) * 4
    short, long_ = _seq(engine, "hi", 4), _seq(engine, SYSTEM * 3, 4)
    batch = step(engine, 1, [short, long_])
    usage = engine.kv_usage()
    assert usage.bytes_per_token == per_token
    assert usage.tokens_held == short.num_prompt_tokens + long_.num_prompt_tokens
    width = dense(batch).mask.shape[1]
    assert usage.bytes_held >= 2 * width * per_token  # both rows as long as the longest
    assert usage.waste_ratio > 1.5
    batch = step(engine, 2, [short], [short.id])  # the long row left
    after = engine.kv_usage()
    assert after.tokens_held == short.num_prompt_tokens + 1 and after.bytes_held < usage.bytes_held / 2
    engine.execute(keeping(engine, 3, []))  # the last row leaves
    assert engine.kv_usage().bytes_held == 0 and engine.kv_usage().waste_ratio is None


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
def test_a_long_row_and_short_ones_decode_in_their_own_buckets_and_stay_exact(request, model_fixture: str) -> None:
    """Short prompts joining a long one (or the other way round) get a bucket of their own
    when padding them to its length costs more than a bucket does; the
    greedy tokens are still generate's, and the KV held is what the rows need, about."""
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    engine.bucket_bytes = 50 * engine.kv_bytes_per_token  # a bucket costs what 50 padded columns do
    long_, shorts = _seq(engine, SYSTEM * 3, 6), [_seq(engine, p, 6) for p in PROMPTS[:3]]
    batch = step(engine, 1, [long_])
    batch = step(engine, 2, shorts, [long_.id])
    assert [b.ids for b in batch] == [[long_.id], ids(shorts)]
    everyone = [long_, *shorts]
    usage = engine.kv_usage()
    # One dense batch would hold every short row at the long one's length (and spare room).
    padded = len(everyone) * (long_.num_prompt_tokens + kv_cache.SPARE_COLUMNS) * usage.bytes_per_token
    assert usage.bytes_held < 0.6 * padded
    forwards = []
    # the embedding runs once a forward, transformers' or the Llama family's lean one
    hook = engine.model.get_input_embeddings().register_forward_pre_hook(lambda *_: forwards.append(1))
    for n in range(3, 8):  # the plan's order is the order they joined; the answers come back in it
        batch = step(engine, n, everyone, ids(everyone))
    hook.remove()
    assert len(forwards) == 5  # one forward a step, whatever the buckets: the weights are read once
    for seq in everyone:
        assert seq.output_ids[:6] == reference(model_dir, seq.request.prompt, 6), seq.request.prompt
    # The long row leaves: the short ones are one bucket, as they were.
    batch = step(engine, 9, shorts, ids(shorts))
    assert [b.ids for b in batch] == [ids(shorts)]


def test_equal_prompts_and_late_joiners_of_similar_length_share_one_bucket(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    a, b, c = (_seq(engine, p, 8) for p in PROMPTS[:3])
    batch = step(engine, 1, [a, b])
    batch = step(engine, 2, [c], ids([a, b]))
    assert len(batch) == 1 and engine.held_rows().decoding == ids([a, b, c])


def test_buckets_merge_when_the_rows_that_kept_them_apart_leave(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.bucket_bytes = 50 * engine.kv_bytes_per_token  # a bucket costs what 50 padded columns do
    long_, short, other = _seq(engine, SYSTEM * 3, 8), _seq(engine, PROMPTS[0], 8), _seq(engine, PROMPTS[1], 8)
    batch = step(engine, 1, [long_, other])  # padded together: one bucket
    batch = step(engine, 2, [short], ids([long_, other]))
    assert len(batch) == 2
    engine.execute(keeping(engine, 3, [], ids([other, short])))  # the long row leaves: its padding goes
    assert [b.ids for b in engine.decoding_buckets()] == [ids([other, short])]


def test_a_newcomer_joining_an_earlier_bucket_gets_its_own_tokens_back(tiny_model_dir: Path) -> None:
    """Buckets hold rows out of the order they joined; a step answers in the plan's order."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.bucket_bytes = 50 * engine.kv_bytes_per_token  # a bucket costs what 50 padded columns do
    a, long_, c = _seq(engine, PROMPTS[0], 6), _seq(engine, SYSTEM * 3, 6), _seq(engine, PROMPTS[1], 6)
    batch = step(engine, 1, [a])
    batch = step(engine, 2, [long_], [a.id])
    batch = step(engine, 3, [c], ids([a, long_]))
    assert [b.ids for b in batch] == [ids([a, c]), [long_.id]]
    for n in range(4, 9):
        batch = step(engine, n, [a, long_, c], ids([a, long_, c]))
    for seq in (a, long_, c):
        assert seq.output_ids[:6] == reference(tiny_model_dir, seq.request.prompt, 6), seq.request.prompt


@pytest.mark.asyncio
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_rows_parked_for_another_users_request_resume_exactly(request, model_fixture: str) -> None:
    """Fair share: alice's rows fill the batch; bob's requests park some of them (their KV set
    aside) and they resume later. Every answer equals ``generate``, and a seeded sampled row
    parked on the way gives the text it gives alone."""
    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    s = await started(engine, max_batch_size=3)
    seeded = SamplingParams(max_tokens=24, temperature=0.9, top_k=50, seed=7)
    alone = await (await s.submit(Request("sampling test", seeded, owner="alice"))).result()
    alice = [await s.submit(Request(p, SamplingParams(max_tokens=n), owner="alice"))
             for p, n in zip(PROMPTS[:2], (40, 36), strict=True)]
    alice.append(await s.submit(Request("sampling test", seeded, owner="alice")))
    for _ in range(200):  # until alice's rows decode
        if s.collector.ttft_ms.count == 4:
            break
        await asyncio.sleep(0.005)
    bob = [await s.submit(Request(p, SamplingParams(max_tokens=n), owner="bob"))
           for p, n in zip(PROMPTS[2:4], (6, 5), strict=True)]
    results = await asyncio.gather(*(st.result() for st in alice + bob))
    await s.stop()
    assert s.collector.parked_rows >= 1
    for result, prompt, n in zip(results[:2] + results[3:], PROMPTS[:4], (40, 36, 6, 5), strict=True):
        assert list(result.token_ids) == reference(model_dir, prompt, n), prompt
    assert results[2].text == alone.text
