"""Constrained rows inside the hf engine's batch: each token is the model's own best among
those the grammar allows (or one the grammar forced), the KV of forced runs is right, and
the rows beside them are untouched."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from jupyter_infer.constraints.spec import from_body
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 6}, "count": {"type": "integer", "minimum": 0, "maximum": 40},
    "kind": {"enum": ["alpha", "beta", "gamma-ray"]}}, "required": ["title", "count", "kind"],
    "additionalProperties": False}
PROMPTS = ["Describe it", "A much longer prompt about the KV cache and batching of many rows", "Go"]


def replay(engine, grammar, prompt_ids: list[int], output: list[int]) -> int:
    """Check ``output`` token by token against a fresh single-row forward over everything
    before it; the number of tokens the grammar forced."""
    row, forced, vocab = grammar.row(), 0, engine.grammars.vocab
    expect: list[int] = []
    for j, token in enumerate(output):
        if token in engine.text.eos_token_ids:
            assert row.done and j == len(output) - 1
            break
        if expect:
            assert token == expect.pop(0)
            forced += 1
        else:
            with torch.inference_mode():
                logits = engine.model(torch.tensor([prompt_ids + output[:j]])).logits[0, -1]
            allowed = torch.from_numpy(row.allowed(vocab))
            assert allowed[token]
            assert token == int(torch.argmax(logits.float().masked_fill(~allowed[: logits.shape[-1]], -1e30)))
        row.advance([token])
        if not expect:
            expect = row.forced()
    return forced


def doom_the_regex(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of the regex ``[a-z]{30}`` have their matcher fail (as out of the library's
    fuel) after three tokens; every other row is as it is."""
    from jupyter_infer.constraints import grammar as grammar_module

    real, made = grammar_module.GrammarRow.error, grammar_module.Grammar.row

    def row(self):
        out = made(self)
        out.doomed = self.constraint.spec == "[a-z]{30}"
        return out

    monkeypatch.setattr(grammar_module.GrammarRow, "error", property(
        lambda self: "out of fuel" if getattr(self, "doomed", False) and self.tokens >= 3 else real.fget(self)))
    monkeypatch.setattr(grammar_module.Grammar, "row", row)


@pytest.mark.timeout(120)
def test_constrained_greedy_rows_are_the_models_best_allowed_tokens(tiny_model_dir: Path) -> None:
    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1, prefix_cache_mb=0))
        service.start()
        await service.wait_ready()
        constraint = from_body({"json_schema": SCHEMA}, native=True)
        requests = [Request(p, SamplingParams(max_tokens=80, constraint=constraint)) for p in PROMPTS]
        free = Request("A free row beside them", SamplingParams(max_tokens=30, ignore_eos=True))
        streams = [await service.submit(r) for r in [*requests, free]]
        results = [await s.result() for s in streams]
        engine = service._loop.engine
        grammar = engine.grammars.compile(constraint)
        await service.stop()
        return engine, grammar, results

    engine, grammar, results = asyncio.run(main())
    forced = 0
    for result in results[:3]:
        assert result.finish_reason == "stop"
        json.loads(result.text)
        forced += replay(engine, grammar, list(result.prompt_ids), list(result.token_ids))
    assert forced > 0  # the keys and punctuation came without sampling
    free = results[3]
    with torch.inference_mode():
        alone = engine.model.generate(torch.tensor([list(free.prompt_ids)]), max_new_tokens=30, do_sample=False,
                                      min_new_tokens=30, pad_token_id=engine.pad_token_id)
    assert list(free.token_ids) == alone[0, len(free.prompt_ids):].tolist()


@pytest.mark.timeout(120)
def test_a_grammar_that_fails_fails_its_row_alone(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A matcher in its library's error state (e.g. out of fuel on a hostile grammar) ends its
    own request with an error; its batch-mates go on."""
    from jupyter_infer.errors import ConstraintFailed

    doom_the_regex(monkeypatch)

    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1))
        service.start()
        await service.wait_ready()
        doomed = Request("x", SamplingParams(max_tokens=40, constraint=from_body({"regex": "[a-z]{30}"}, native=True)))
        fine = Request("y", SamplingParams(max_tokens=40, constraint=from_body({"json_schema": SCHEMA}, native=True)))
        free = Request("z", SamplingParams(max_tokens=12, ignore_eos=True))
        streams = [await service.submit(r) for r in (doomed, fine, free)]
        outcomes = await asyncio.gather(*(s.result() for s in streams), return_exceptions=True)
        await service.stop()
        return outcomes

    doomed, fine, free = asyncio.run(main())
    assert isinstance(doomed, ConstraintFailed) and doomed.status == 400 and "out of fuel" in doomed.message
    assert fine.finish_reason == "stop" and json.loads(fine.text)
    assert free.completion_tokens == 12


def test_a_tokenizer_the_grammar_library_cannot_read_leaves_the_model_served(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow (Python-only) tokenizer: the model loads and answers; a constrained request is
    a 400 that says why."""
    from jupyter_infer.constraints import grammar as grammar_module
    from jupyter_infer.errors import InvalidRequest

    def refuse(*args, **kwargs):
        raise ValueError("Only fast tokenizers are supported")

    monkeypatch.setattr(grammar_module.GrammarCompiler, "for_hf", classmethod(refuse))

    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1))
        service.start()
        await service.wait_ready()
        plain = await (await service.submit(Request("hi", SamplingParams(max_tokens=3, ignore_eos=True)))).result()
        with pytest.raises(InvalidRequest, match="cannot constrain"):
            await service.submit(Request("hi", SamplingParams(constraint=from_body({"regex": "a+"}, native=True))))
        await service.stop()
        return plain

    assert asyncio.run(main()).completion_tokens == 3


def test_date_times_fit_the_validators_clients_use(tiny_model_dir: Path) -> None:
    """llguidance's date-time allows seconds 60 at any minute; jsonschema and pydantic refuse
    them, so the compiled grammar keeps a time's seconds below 60 (found by bench [i])."""
    from jupyter_infer.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    for fmt, good, bad in [("date-time", "2024-02-28T14:32:59-19:33", "2024-02-28T14:32:60-19:33"),
                           ("time", "14:32:59Z", "14:32:60Z")]:
        grammar = engine.grammars.compile(from_body({"json_schema": {"type": "string", "format": fmt}}, native=True))
        for text, fits in [(good, True), (bad, False)]:
            row = grammar.row()
            ids = engine.text.tokenize(json.dumps(text))
            assert (row.matcher.consume_tokens(ids) and row.matcher.is_accepting()) is fits, (fmt, text)


@pytest.mark.timeout(120)
def test_rows_in_other_buckets_keep_their_errors_and_forced_counts(tiny_model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of very different lengths decode in separate buckets; a constrained row's error and
    forced tokens still reach the scheduler (found in review: they were dropped there)."""
    from jupyter_infer.engine import hf
    from jupyter_infer.errors import ConstraintFailed

    doom_the_regex(monkeypatch)
    seen = []
    decode = hf.HFEngine.decode
    monkeypatch.setattr(hf.HFEngine, "decode", lambda self, seqs, *more: seen.append(len(self.decoding_buckets())) or
                        decode(self, seqs, *more))

    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1, prefix_cache_mb=0, prefill_chunk_tokens=0))
        service.start()
        await service.wait_ready()
        engine = service._loop.engine
        engine.bucket_bytes = 50 * engine.kv_bytes_per_token  # a bucket costs what 50 padded columns do
        long = Request("batching " * 180, SamplingParams(max_tokens=30, ignore_eos=True))
        doomed = Request("x", SamplingParams(max_tokens=40, constraint=from_body({"regex": "[a-z]{30}"}, native=True)))
        fine = Request("y", SamplingParams(max_tokens=60, constraint=from_body({"json_schema": SCHEMA}, native=True)))
        streams = [await service.submit(r) for r in (long, doomed, fine)]
        outcomes = await asyncio.gather(*(s.result() for s in streams), return_exceptions=True)
        records = {r["id"]: r for r in service.batches()["requests"]}
        await service.stop()
        return outcomes, records

    (long, doomed, fine), records = asyncio.run(main())
    assert max(seen) > 1  # the long row decoded in a bucket of its own
    assert isinstance(doomed, ConstraintFailed)
    assert fine.finish_reason == "stop" and json.loads(fine.text) and records[fine.id]["forced_tokens"] > 0
    assert long.completion_tokens == 30


def test_the_service_and_the_simulated_engine_need_no_torch() -> None:
    """Structured outputs did not make torch a need of the service or of the simulated engine
    (the fallback where torch is missing): a constrained answer comes from a process without it."""
    import subprocess
    import sys

    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch here")
sys.meta_path.insert(0, Block())
import asyncio, json
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.constraints.spec import from_body
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.service.inference import InferenceService
async def main():
    service = InferenceService(ServiceConfig(engine="simulated", simulated_token_delay_ms=(0.0, 0.0)))
    service.start()
    await service.wait_ready()
    c = from_body({"choice": ["yes", "no"]}, native=True)
    r = await (await service.submit(Request("Is it?", SamplingParams(max_tokens=8, constraint=c)))).result()
    await service.stop()
    print(json.dumps([r.text, "torch" in sys.modules]))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    text, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert text in ("yes", "no") and not torch_loaded


def test_a_long_forced_run_is_fed_over_several_steps(tiny_model_dir: Path) -> None:
    """A choice of one long string: the grammar forces all of it, a step takes at most
    FORCED_PER_STEP of it (a run as wide as the answer would stall the batch)."""
    from jupyter_infer.constraints.grammar import FORCED_PER_STEP

    text = "the quick brown fox jumps over the lazy dog " * 12

    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1))
        service.start()
        await service.wait_ready()
        c = from_body({"choice": [text]}, native=True)
        result = await (await service.submit(Request("x", SamplingParams(max_tokens=300, constraint=c)))).result()
        [batch] = service.batches()["batches"]
        await service.stop()
        return result, batch

    result, batch = asyncio.run(main())
    assert result.text == text and result.finish_reason == "stop"
    assert batch["steps"] >= result.completion_tokens / (FORCED_PER_STEP + 1)


def test_a_burst_of_one_new_schema_compiles_it_once(tiny_model_dir: Path) -> None:
    async def main():
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1))
        service.start()
        await service.wait_ready()
        c = from_body({"json_schema": SCHEMA}, native=True)
        streams = await asyncio.gather(*(service.submit(Request(f"p{i}", SamplingParams(max_tokens=60, constraint=c)))
                                         for i in range(8)))
        await asyncio.gather(*(s.result() for s in streams))
        stats = service.metrics()["structured_outputs"]
        await service.stop()
        return stats

    assert asyncio.run(main())["compiled"] == 1
