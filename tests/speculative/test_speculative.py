"""Speculative decoding (n-gram prompt lookup): the guesses, and answers identical to decoding
without them, token for token, on locally built GPT-2 and Llama shapes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from engine_steps import keeping
from test_hf_engine import _real_kv, _seq, reference

from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.speculative.ngram import propose
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, RequestResult, SamplingParams

# Answers that quote their prompt: code being rewritten, a record whose fields repeat.
COPY = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nThe same functions, with type hints:\n",
    "name: Ada; role: engineer; team: infra\nname: Grace; role: admiral; team: navy\nname:",
    "The KV cache stores keys and values. The KV cache stores keys and values. The KV",
]


def test_a_guess_is_what_followed_the_latest_earlier_occurrence_of_the_last_tokens() -> None:
    assert propose([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]  # "1 2 3" came before, then 9 1
    assert propose([5, 1, 2, 7, 1, 2, 8, 1, 2], 3) == [8, 1, 2]  # the latest occurrence wins
    assert propose([1, 2, 3, 4], 4) == []  # nothing repeats
    assert propose([4, 4, 4, 4], 3) == [4, 4, 4]  # a run goes on
    # A match one period back guesses the next periods (the guess repeats itself).
    assert propose([9, 1, 2, 3, 1, 2, 3], 5) == [1, 2, 3, 1, 2]
    assert propose([1, 2, 1, 2], 0) == [] and propose([1], 3) == []
    # The longest suffix first: "7 1 2" recurs after "1 2" elsewhere.
    assert propose([1, 2, 5, 7, 1, 2, 6, 7, 1, 2], 1) == [6]


async def _answers(engine: HFEngine, prompts: list[str], n: list[int], *, late: bool = False,
                   **config) -> tuple[list[RequestResult], dict]:
    engine.text.eos_token_ids = frozenset()
    service = InferenceService(ServiceConfig(prefix_cache_mb=0, **config), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    half = len(prompts) // 2 if late else len(prompts)
    streams = [await service.submit(Request(p, SamplingParams(max_tokens=k))) for p, k in zip(prompts[:half], n, strict=False)]
    if late:
        for _ in range(200):  # the first ones decode before the others join
            if service.collector.ttft_ms.count >= half:
                break
            await asyncio.sleep(0.005)
        streams += [await service.submit(Request(p, SamplingParams(max_tokens=k)))
                    for p, k in zip(prompts[half:], n[half:], strict=True)]
    results = await asyncio.gather(*(s.result() for s in streams))
    metrics = service.metrics()
    await service.stop()
    return results, metrics["speculative"]


@pytest.mark.asyncio
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
async def test_speculative_answers_equal_generate_with_late_joiners(request, model_fixture: str) -> None:
    model_dir: Path = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    lengths = [40, 33, 27, 45]
    prompts = [*COPY, COPY[0].replace("add", "mul")]
    results, spec = await _answers(engine, prompts, lengths, late=True)
    assert spec["accepted_tokens"] > 0 and spec["tokens_per_row_step"] > 1.0  # it guessed, and right
    for result, prompt, n in zip(results, prompts, lengths, strict=True):
        assert list(result.token_ids) == reference(model_dir, prompt, n), prompt


@pytest.mark.asyncio
async def test_a_row_that_ends_inside_an_accepted_run_gets_exactly_its_tokens(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    full = reference(tiny_model_dir, COPY[2], 40)
    for n in (5, 6, 7, 9):  # somewhere inside a run of accepted guesses, whichever
        [result], spec = await _answers(engine, [COPY[2]], [n])
        assert list(result.token_ids) == full[:n] and result.completion_tokens == n
    assert spec["accepted_tokens"] > 0


@pytest.mark.asyncio
async def test_a_stop_string_inside_an_accepted_run_cuts_the_answer_as_without_guesses(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    text = engine.text.detokenize(reference(tiny_model_dir, COPY[2], 40))
    stop = text[len(text) // 2 : len(text) // 2 + 4]

    async def answer(speculative: str) -> RequestResult:
        service = InferenceService(ServiceConfig(prefix_cache_mb=0, speculative=speculative), engine_loader=lambda: engine)
        service.start()
        await service.wait_ready()
        result = await (await service.submit(Request(COPY[2], SamplingParams(max_tokens=40, stop=(stop,))))).result()
        await service.stop()
        return result

    plain, guessed = await answer("off"), await answer("ngram")
    assert guessed.text == plain.text and guessed.finish_reason == plain.finish_reason == "stop"
    assert stop not in guessed.text


@pytest.mark.asyncio
async def test_off_and_past_the_row_limit_nothing_is_drafted(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    _, off = await _answers(engine, COPY[:1], [20], speculative="off")
    assert off["draft_tokens"] == 0 and off["tokens_per_row_step"] == 1.0
    _, crowded = await _answers(engine, COPY, [20] * 3, speculative="ngram", speculative_max_rows=0)
    assert crowded["draft_tokens"] == 0  # more rows than 0: never a guess (the rule: test_scheduler_core)
    _, alone = await _answers(engine, COPY[2:], [20], speculative="ngram", speculative_max_rows=1)
    assert alone["draft_tokens"] > 0  # alone, the same row guesses


def test_the_engine_proposes_what_the_plan_allows_and_nothing_more(tiny_model_dir: Path) -> None:
    """Who guesses and how many is the scheduler's: a row with no guesses in the plan proposes
    none, one allowed k proposes at most k."""
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    engine.configure_speculation("ngram", 16, 8)
    seqs = [_seq(engine, p, 40) for p in COPY]
    sampled = engine.execute(keeping(engine, 0, seqs))
    allowed = {0: [], 1: [0, 3, 0], 2: [2, 0, 5]}
    proposed = []
    for step in range(9):
        for seq, output in zip(seqs, sampled, strict=True):
            seq.output_ids += output.tokens
            seq.num_computed = len(seq.prompt_ids) + len(seq.output_ids) - 1
        guesses = allowed[step % 3]
        sampled = engine.execute(keeping(engine, 0, seqs, [s.id for s in seqs], guesses=guesses))
        for i, output in enumerate(sampled):
            assert output.proposed <= (guesses[i] if guesses else 0)
        proposed += [o.proposed for o in sampled]
    assert any(proposed)  # the copy-heavy prompts found something to guess


def test_rejected_guesses_leave_no_trace_in_the_kv(llama_model_dir: Path) -> None:
    """Three rows in one bucket guess and keep different numbers of their guesses: each row's
    tokens are those of decoding one token a step, and its KV (its real columns) is that of a
    cold prefill of all its tokens but the last, at the position after them."""
    engine = HFEngine(str(llama_model_dir), dtype="float32", num_threads=1)

    def decode(speculate: bool, steps: int) -> list:
        """Fresh rows of the COPY prompts, ``steps`` steps (every row the engine held leaves)."""
        engine.configure_speculation("ngram" if speculate else "off", 4, 8)
        seqs = [_seq(engine, p, 64) for p in COPY]
        sampled = engine.execute(keeping(engine, 0, seqs))
        for _ in range(steps):
            for seq, tokens in zip(seqs, [o.tokens for o in sampled], strict=True):
                seq.output_ids += tokens
            guesses = [4] * len(seqs) if speculate else []  # the scheduler's part, here fixed
            sampled = engine.execute(keeping(engine, 0, seqs, [s.id for s in seqs], guesses=guesses))
        for seq, tokens in zip(seqs, [o.tokens for o in sampled], strict=True):
            seq.output_ids += tokens
        return seqs

    guessed = decode(True, 8)
    assert sum(len(s.output_ids) for s in guessed) > 3 * 9  # more than a token a step
    engine.configure_speculation("off", 0, 0)
    held = [s.id for s in guessed]
    for seq in guessed:  # cold prefills beside the rows that guessed (a prefill leaves them be)
        tokens = [*seq.prompt_ids, *seq.output_ids[:-1]]  # the last one is fed next step
        cold = _seq(engine, "", 1)
        cold.prompt_ids = tokens
        engine.execute(keeping(engine, 0, [cold], held))
        held.append(cold.id)
        buckets = engine.decoding_buckets()
        expected, got = _real_kv(buckets, cold.id), _real_kv(buckets, seq.id)
        assert [t.shape for t in got] == [t.shape for t in expected]
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        bucket = next(b for b in buckets if seq.id in b.ids)
        assert int(bucket.positions[bucket.ids.index(seq.id)]) == len(tokens)
    plain = decode(False, max(len(s.output_ids) for s in guessed))
    for seq, one_by_one in zip(guessed, plain, strict=True):
        assert seq.output_ids == one_by_one.output_ids[: len(seq.output_ids)]


def test_a_sampled_rows_tokens_follow_its_models_distribution_guesses_or_not() -> None:
    """Rejection sampling with a sure draft: the first token is distributed as the model's
    first distribution says, and after an accepted guess the next as its second says."""
    from jupyter_infer.decoding.sampling import RowSampler, filter_logits
    from jupyter_infer.speculative.acceptance import accept_sampled

    params = SamplingParams(temperature=0.8, top_k=6, max_tokens=8)
    sampler = RowSampler.build(params, [1], frozenset())
    sampler.generator.manual_seed(0)
    logits = torch.randn((3, 8), generator=torch.Generator().manual_seed(1)) * 2
    target = [torch.softmax(filter_logits(logits[j], params), dim=-1) for j in range(3)]
    guess = [int(target[0].argsort()[-2]), int(target[1].argmax())]  # likely, but not sure
    trials, first, second, kept = 20_000, torch.zeros(8), torch.zeros(8), 0
    for _ in range(trials):
        tokens = accept_sampled(logits, guess, sampler)
        first[tokens[0]] += 1
        if tokens[0] == guess[0]:
            kept += 1
            second[tokens[1]] += 1
    assert (first / trials - target[0]).abs().max() < 0.015
    assert (second / kept - target[1]).abs().max() < 0.02
    assert abs(kept / trials - float(target[0][guess[0]])) < 0.015  # kept as often as the model picks it


@pytest.mark.asyncio
async def test_sampled_rows_speculate_and_seeded_rows_do_not(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    engine.text.eos_token_ids = frozenset()
    service = InferenceService(ServiceConfig(prefix_cache_mb=0), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    cool = SamplingParams(max_tokens=30, temperature=0.05)  # near-greedy: it repeats itself, so it guesses
    results = [await (await service.submit(Request(COPY[2], cool))).result() for _ in range(3)]
    assert all(r.completion_tokens == 30 for r in results)
    drafted = service.metrics()["speculative"]["draft_tokens"]
    assert drafted > 0
    seeded = SamplingParams(max_tokens=30, temperature=0.3, seed=7)
    alone = await (await service.submit(Request(COPY[2], seeded))).result()
    assert service.metrics()["speculative"]["draft_tokens"] == drafted  # a seeded row guessed nothing
    crowd = [await service.submit(Request(p, SamplingParams(max_tokens=30))) for p in COPY * 2]
    again = await service.submit(Request(COPY[2], seeded))
    assert (await again.result()).text == alone.text  # the same tokens in a crowd of 7 as alone
    await asyncio.gather(*(c.result() for c in crowd))
    await service.stop()


@pytest.fixture
def jp_server_config(tiny_model_dir: Path) -> dict:
    from server_helpers import server_config

    return server_config(engine="hf", model=str(tiny_model_dir), dtype="float32", num_threads=1, prefix_cache_mb=0)


async def test_the_server_shows_what_speculation_did(jp_fetch) -> None:
    import json

    body = json.dumps({"prompt": COPY[2], "max_tokens": 40, "ignore_eos": True})
    answer = json.loads((await jp_fetch("infer", "generate", method="POST", body=body)).body)
    assert answer["usage"]["completion_tokens"] == 40
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["speculative"] == {"method": "ngram", "max_tokens": 16, "max_rows": 8, "draft_model": None}
    spec = json.loads((await jp_fetch("infer", "metrics")).body)["speculative"]
    assert spec["accepted_tokens"] > 0 and spec["tokens_per_row_step"] > 1
    batches = json.loads((await jp_fetch("infer", "batches")).body)["batches"]
    assert sum(b["accepted_tokens"] for b in batches) == spec["accepted_tokens"]
    prometheus = (await jp_fetch("metrics")).body.decode()
    assert 'jupyter_infer_speculative_tokens_total{outcome="accepted"}' in prometheus


def test_a_row_guesses_more_after_hits_and_sits_out_after_misses_until_its_paper_guess_lands() -> None:
    from jupyter_infer.speculative.guessing import Guessing, after_verify, sit_out

    state = Guessing(2)
    state = after_verify(state, 2, 2, most=16)
    assert state.k == 4 and after_verify(Guessing(16), 16, 16, most=16).k == 16  # doubled, up to the most
    assert after_verify(Guessing(8), 8, 3, most=16) == Guessing(3)  # what it kept
    missed = after_verify(Guessing(1), 1, 0, most=16)
    assert missed.wait == 8 and missed.backoff == 16  # one guess wrong: sits out, longer next time
    again = after_verify(Guessing(1, 0, missed.backoff), 1, 0, most=16)
    assert again.wait == 16 and again.backoff == 32
    # Sitting out in a run "1 2 3 1 2 3 1": on paper it guesses 2, and the model's token was 2.
    history = [1, 2, 3, 1, 2, 3, 1]
    waiting, back = sit_out(missed, history, on_paper=True)
    assert not back and waiting.wait == 7 and waiting.paper == (7, 2)
    assert sit_out(waiting, [*history, 2], on_paper=True) == (Guessing(1, 0, missed.backoff), True)  # back at once
    later, back = sit_out(waiting, [*history, 9], on_paper=True)  # its paper guess was wrong
    assert not back and later.wait == 6
    assert sit_out(missed, history, on_paper=False)[0].paper is None  # a draft model's guess would cost a forward
    # It sits out all its steps: with nothing on paper, 8 steps without a guess after the miss.
    steps, state = 0, missed
    while True:
        state, back = sit_out(state, [5, 6, 7, 8], on_paper=True) if state.wait else (state, True)
        if back:
            break
        steps += 1
    assert steps == 8
