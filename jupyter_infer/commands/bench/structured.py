"""[i] structured outputs (issue 19): grammar-constrained answers on the bench's model, in process.

Random weights: the text is noise, the structure is the grammar's. Every measurement runs our
service over the shared ``HFEngine`` with the model's own EOS back (a constrained answer ends
when its grammar is complete and the model picks EOS), no prefix cache and no speculation:

- ``structured_corpus``: every schema of ``schemas.corpus()`` once, 16 at a time, greedy: how
  many answers finished (``stop``), how many of those parse and validate against their schema
  (``jsonschema``, formats checked), how many ran out of tokens (``length``).
- ``structured_burst``: 16 concurrent streams on 16 prompts whose corpus answers finished,
  constrained by their schemas with fast-forward off and on, against the same prompts
  unconstrained (``ignore_eos``): each as many tokens as its constrained twin (the same tokens
  and the same ragged batch: what the targets compare with), and each the twins' mean (a full
  batch to the end); completion tokens per second, steps, and the share of the tokens the
  grammars forced.
- ``structured_sampled``: the burst's streams sampled as agents sample (temperature 0.7, top_p
  0.9, a seed each), constrained + fast-forward against unconstrained twins with the same
  seeds, each as many tokens as its constrained answer had (a first pass finds them).
- ``structured_alone``: one request at a time on an idle engine: the TTFT of a schema never
  seen before (a property renamed, so the compile cache misses) against an unconstrained
  request; the compiler's p50/p99 compile times.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ...errors import ConstraintFailed, InvalidRequest
from ..loadgen import Arrival
from .contenders import Contender, Run, in_fresh_thread, serving
from .schemas import corpus
from .workloads import Workload, bench_prompts

CORPUS_BATCH = 16  # corpus answers in flight together
ALONE_TOKENS = 4  # what a TTFT request generates: its first token is the point
SAMPLED = {"temperature": 0.7, "top_p": 0.9}  # how agents sample (issue 31's figure)
# Speculation off: it serves the unconstrained twins (greedy, nothing to shape) and not the
# constrained rows, so the ratios would measure it instead of the grammars' cost.
SERVICE = {"speculative": "off"}


@dataclass(frozen=True)
class Answer:
    """One constrained (or not) answer, as the service returned it."""

    name: str  # the schema's name ("" unconstrained)
    finish_reason: str
    text: str
    tokens: int
    ttft_ms: float | None
    latency_ms: float
    valid: bool | None = None  # None: unconstrained, or not finished


def validates(text: str, schema: dict) -> bool:
    """``text`` is JSON that ``schema`` accepts (formats checked where jsonschema can)."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError:
        return False
    validator = jsonschema.validators.validator_for(schema)
    try:
        validator(schema, format_checker=validator.FORMAT_CHECKER).validate(value)
    except jsonschema.ValidationError:
        return False
    return True


def renamed(schema: dict, n: int) -> dict:
    """``schema`` with its first top-level property renamed (``_n`` appended): a grammar never
    compiled before, as cheap to compile as the original. A schema without properties gets a
    title instead (the spec text, the cache's key, differs all the same)."""
    props = schema.get("properties")
    if not props:
        return {**schema, "title": f"fresh {n}"}
    first = next(iter(props))
    new = f"{first}_{n}"
    out = {**schema, "properties": {(new if k == first else k): v for k, v in props.items()}}
    if first in schema.get("required", []):
        out["required"] = [new if k == first else k for k in schema["required"]]
    return out


@contextmanager
def own_eos(engine: Any, eos_token_ids: frozenset[int]) -> Iterator[None]:
    """The bench's engine ignores EOS (every other section generates exactly what it asks
    for); a constrained answer ends at EOS, so this section gives the model its own back."""
    before = engine.text.eos_token_ids
    engine.text.eos_token_ids = eos_token_ids
    try:
        yield
    finally:
        engine.text.eos_token_ids = before


async def ask(service: Any, prompt: str, max_tokens: int, name: str = "", schema: dict | None = None,
              **params: Any) -> Answer:
    """One greedy request (constrained by ``schema`` when given), streamed to its end."""
    from ...constraints.spec import from_body
    from ...values.request import Request, SamplingParams

    constraint = from_body({"json_schema": schema}, native=True) if schema is not None else None
    sent = time.monotonic()
    try:
        stream = await service.submit(Request(prompt, SamplingParams(max_tokens=max_tokens, constraint=constraint,
                                                                     **params)))
        async for _ in stream:
            pass
        result = await stream.result()
    except (InvalidRequest, ConstraintFailed) as err:  # refused, or failed mid-answer: counted, not fatal
        return Answer(name, "refused", f"{type(err).__name__}: {err}", 0, None, (time.monotonic() - sent) * 1000)
    valid = validates(result.text, schema) if schema is not None and result.finish_reason == "stop" else None
    return Answer(name, result.finish_reason, result.text, result.completion_tokens, result.ttft_ms,
                  (time.monotonic() - sent) * 1000, valid)


def batch_stats(service: Any) -> dict[str, Any]:
    """What the service's batches did: steps, tokens, the share of them grammars forced, and
    the engine's busy time."""
    batches = list(service.collector.batches)
    tokens = sum(b.tokens for b in batches)
    forced = sum(b.forced_tokens for b in batches)
    return {"steps": sum(b.steps for b in batches), "forced_tokens": forced,
            "forced_share": forced / tokens if tokens else 0.0, "engine_busy_s": service.collector.busy_s}


def answers_run(answers: list[Answer], wall_s: float, extra: dict[str, Any], constrained: bool = True) -> Run:
    """A ``Run`` of ``answers``: completion tokens over the wall time; validity counted
    (``constrained``) over the finished ones."""
    finished = [a for a in answers if a.finish_reason == "stop"]
    counts: dict[str, Any] = {"answers": len(answers), "finished": len(finished),
                              "length": sum(a.finish_reason == "length" for a in answers),
                              "refused": sum(a.finish_reason == "refused" for a in answers),
                              "tokens_per_answer": statistics.mean(a.tokens for a in answers) if answers else None}
    if constrained:
        counts["valid"] = sum(bool(a.valid) for a in finished)
        counts["valid_share"] = counts["valid"] / len(finished) if finished else None
    return Run(wall_s, sum(a.tokens for a in answers), [a.ttft_ms for a in answers if a.ttft_ms is not None],
               [a.latency_ms for a in answers], {**counts, **extra})


# -- the corpus: validity ---------------------------------------------------------------------
def measure_corpus(engine: Any, count: Callable[[str], int], max_tokens: int) -> tuple[Run, list[Answer], list[str]]:
    """Every corpus schema once, ``CORPUS_BATCH`` at a time: the run, its answers (in corpus
    order) and the prompts they answered."""
    schemas = corpus()
    prompts = bench_prompts(count, len(schemas))

    async def work(service: Any) -> tuple[list[Answer], float, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        start, answers = loop.time(), []
        for i in range(0, len(schemas), CORPUS_BATCH):
            answers += await asyncio.gather(*(ask(service, prompts[j], max_tokens, *schemas[j])
                                              for j in range(i, min(i + CORPUS_BATCH, len(schemas)))))
        return answers, loop.time() - start, batch_stats(service)

    answers, wall, stats = in_fresh_thread(lambda: asyncio.run(serving(engine, work, **SERVICE)))
    return answers_run(answers, wall, stats), answers, prompts


def corpus_notes(answers: list[Answer]) -> list[str]:
    """The answers worth naming: invalid ones (a bug) and those cut short by max_tokens."""
    notes = []
    invalid = [a.name for a in answers if a.finish_reason == "stop" and not a.valid]
    if invalid:
        notes.append(f"INVALID answers ({len(invalid)}): " + ", ".join(invalid))
    cut = [a.name for a in answers if a.finish_reason == "length"]
    if cut:
        notes.append(f"hit max_tokens (length, not counted for validity; {len(cut)}): " + ", ".join(cut))
    refused = [f"{a.name} ({a.text})" for a in answers if a.finish_reason == "refused"]
    if refused:
        notes.append(f"REFUSED schemas ({len(refused)}): " + "; ".join(refused))
    return notes


# -- the burst: throughput --------------------------------------------------------------------
def burst_workload(answers: list[Answer], prompts: list[str], streams: int) -> tuple[Workload, list[tuple[str, dict]]]:
    """``streams`` prompts whose corpus answers finished, with their schemas (cycled when
    fewer finished); each arrival asks for as many tokens as its corpus answer had (what an
    unconstrained twin generates)."""
    schemas = dict(corpus())
    done = [i for i, a in enumerate(answers) if a.finish_reason == "stop"]
    if not done:
        raise RuntimeError("no corpus answer finished within max_tokens: nothing to compare")
    chosen = [done[k % len(done)] for k in range(streams)]
    lengths = [answers[i].tokens for i in chosen]
    workload = Workload("structured_burst", f"{streams} streams at once on prompts whose corpus answers finish "
                        f"({min(lengths)}-{max(lengths)} tokens, mean {statistics.mean(lengths):.0f}), greedy",
                        [Arrival(0.0, prompts[i], answers[i].tokens) for i in chosen])
    return workload, [(answers[i].name, schemas[answers[i].name]) for i in chosen]


class Streams(Contender):
    """All the workload's prompts at once: each constrained by its schema (``schemas``) up to
    ``max_tokens``, or unconstrained (``ignore_eos``): each as many tokens as its arrival
    asks (its constrained twin's length), or (``mean_length``) all the mean of those."""

    def __init__(self, engine: Any, name: str, label: str, *, schemas: list[tuple[str, dict]] | None = None,
                 fast_forward: bool = True, max_tokens: int = 256, mean_length: bool = False,
                 sampled: bool = False) -> None:
        self.engine, self.name, self.label = engine, name, label
        self.schemas, self.fast_forward, self.max_tokens = schemas, fast_forward, max_tokens
        self.mean_length, self.sampled = mean_length, sampled

    def sampling(self, stream: int) -> dict[str, Any]:
        """Greedy, or (``sampled``) ``SAMPLED`` with a seed per stream: twins draw alike."""
        return sampled_params(stream) if self.sampled else {}

    def run(self, workload: Workload) -> Run:
        return asyncio.run(serving(self.engine, lambda service: self._burst(service, workload),
                                   grammar_fast_forward=self.fast_forward, **SERVICE))

    async def _burst(self, service: Any, workload: Workload) -> Run:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self.schemas is None:
            lengths = [a.max_tokens for a in workload.arrivals]
            if self.mean_length:
                lengths = [round(statistics.mean(lengths))] * len(lengths)
            asks = [ask(service, a.prompt, n, ignore_eos=True, **self.sampling(i))
                    for i, (a, n) in enumerate(zip(workload.arrivals, lengths, strict=True))]
        else:
            asks = [ask(service, a.prompt, self.max_tokens, *s, **self.sampling(i))
                    for i, (a, s) in enumerate(zip(workload.arrivals, self.schemas, strict=True))]
        answers = await asyncio.gather(*asks)
        return answers_run(answers, loop.time() - start, batch_stats(service), self.schemas is not None)


def sampled_params(stream: int) -> dict[str, Any]:
    """Stream ``stream``'s sampling: ``SAMPLED`` and a seed of its own."""
    return {**SAMPLED, "seed": stream}


def sampled_workload(engine: Any, burst: Workload, chosen: list[tuple[str, dict]], max_tokens: int) -> Workload:
    """The burst's prompts, each asking for as many tokens as its sampled constrained answer
    has (one pass of them; the seeds make every later pass draw the same)."""

    async def lengths(service: Any) -> list[int]:
        answers = await asyncio.gather(*(ask(service, a.prompt, max_tokens, *s, **sampled_params(i))
                                         for i, (a, s) in enumerate(zip(burst.arrivals, chosen, strict=True))))
        return [max(1, a.tokens) for a in answers]

    counts = in_fresh_thread(lambda: asyncio.run(serving(engine, lengths, **SERVICE)))
    return Workload("structured_sampled", f"{len(counts)} streams at once, sampled (temperature {SAMPLED['temperature']}, "
                    f"top_p {SAMPLED['top_p']}, a seed each; {min(counts)}-{max(counts)} tokens, mean "
                    f"{statistics.mean(counts):.0f})", [Arrival(0.0, a.prompt, n) for a, n in zip(burst.arrivals, counts, strict=True)])


# -- one at a time: TTFT ------------------------------------------------------------------------
class OneAtATime(Contender):
    """The workload's prompts one after the other on an idle engine, ``ALONE_TOKENS`` each:
    unconstrained, or (``fresh``) each constrained by a corpus schema never compiled before."""

    def __init__(self, engine: Any, name: str, label: str, fresh: bool) -> None:
        self.engine, self.name, self.label, self.fresh = engine, name, label, fresh
        self._schemas = [(n, s) for n, s in corpus() if s.get("properties")]
        self._next = 0  # every request of every run gets a new schema

    def run(self, workload: Workload) -> Run:
        return asyncio.run(serving(self.engine, lambda service: self._one_by_one(service, workload), **SERVICE))

    async def _one_by_one(self, service: Any, workload: Workload) -> Run:
        loop = asyncio.get_running_loop()
        start, answers = loop.time(), []
        for a in workload.arrivals:
            if self.fresh:
                name, schema = self._schemas[self._next % len(self._schemas)]
                answers.append(await ask(service, a.prompt, a.max_tokens, name, renamed(schema, self._next)))
                self._next += 1
            else:
                answers.append(await ask(service, a.prompt, a.max_tokens, ignore_eos=True))
        wall = loop.time() - start
        extra = {}
        compiles = service.metrics().get("structured_outputs") or {}
        if self.fresh:  # the compiler's recent compiles: the corpus's and every fresh schema's
            extra = {k: compiles.get(k) for k in ("compiled", "compile_ms_p50", "compile_ms_p99", "compile_ms_max")}
        # A few tokens each: cut short by design, nothing to validate.
        return answers_run(answers, wall, extra, constrained=False)


def alone_workload(count: Callable[[str], int], n: int) -> Workload:
    prompts = bench_prompts(count, n)
    return Workload("structured_alone", f"{n} requests one at a time on an idle engine, {ALONE_TOKENS} tokens each",
                    [Arrival(0.0, p, ALONE_TOKENS) for p in prompts])


# -- the section ------------------------------------------------------------------------------
def measure(engine: Any, eos_token_ids: frozenset[int], count: Callable[[str], int], sizes: tuple[int, int, int],
            repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The section's three workloads (``sizes``: streams, max_tokens, requests one at a time),
    as the suite keeps them; each measured as the others are (``measure_rounds``) but the
    corpus, which runs once (it is deterministic: its figure is validity, not speed)."""
    from .rounds import measure_rounds

    streams, max_tokens, alone_n = sizes
    if not eos_token_ids:
        return {"structured_corpus": {"error": "the model has no EOS token: a constrained answer could never end"}}
    out: dict[str, Any] = {}
    with own_eos(engine, eos_token_ids):
        schemas = corpus()
        log(f"\n[i] structured: {len(schemas)} corpus schemas, {CORPUS_BATCH} at a time, greedy, "
            f"max_tokens {max_tokens}")
        run, answers, prompts = measure_corpus(engine, count, max_tokens)
        s = run.stats()
        log(f"  corpus: {s['finished']}/{s['answers']} finished, {s['valid']} of them valid, {s['length']} hit "
            f"max_tokens; {s['tokens_per_s']:.1f} tok/s, {s['forced_share']:.0%} of tokens fast-forwarded")
        out["structured_corpus"] = {
            "name": "structured_corpus", "requests": len(answers),
            "description": f"every corpus schema once ({len(answers)}), {CORPUS_BATCH} at a time, greedy, "
                           f"max_tokens {max_tokens}",
            "contenders": {"corpus": {"label": "constrained + fast-forward", "median": s, "runs": [s]}},
            "notes": corpus_notes(answers),
            "answers": [{"schema": a.name, "finish_reason": a.finish_reason, "tokens": a.tokens, "valid": a.valid,
                         "text": a.text} for a in answers],
        }
        if not s["finished"]:
            out["structured_burst"] = {"error": f"no corpus answer finished within {max_tokens} tokens"}
            return out
        burst, chosen = burst_workload(answers, prompts, streams)
        log(f"  burst: {burst.description}")
        out[burst.name] = {**burst.describe(), "schemas": [n for n, _ in chosen], "contenders": measure_rounds(burst, [
            Streams(engine, "unconstrained_mean", "unconstrained, mean length each", mean_length=True),
            Streams(engine, "unconstrained", "unconstrained, twin's length each"),
            Streams(engine, "no_ff", "constrained, no fast-forward", schemas=chosen, fast_forward=False,
                    max_tokens=max_tokens),
            Streams(engine, "ff", "constrained + fast-forward", schemas=chosen, max_tokens=max_tokens),
        ], repeats, log)}
        sampled = sampled_workload(engine, burst, chosen, max_tokens)
        log(f"  sampled: {sampled.description}")
        out[sampled.name] = {**sampled.describe(), "schemas": [n for n, _ in chosen], "contenders": measure_rounds(sampled, [
            Streams(engine, "unconstrained", "unconstrained, sampled, twin's length", sampled=True),
            Streams(engine, "ff", "constrained + fast-forward, sampled", schemas=chosen, max_tokens=max_tokens,
                    sampled=True),
        ], repeats, log)}
        alone = alone_workload(count, alone_n)
        log(f"  one at a time: {alone.description}")
        out[alone.name] = {**alone.describe(), "contenders": measure_rounds(alone, [
            OneAtATime(engine, "unconstrained", "unconstrained", fresh=False),
            OneAtATime(engine, "new_schema", "constrained, a new schema each", fresh=True),
        ], repeats, log)}
    return out
