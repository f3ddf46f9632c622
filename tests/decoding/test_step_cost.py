"""How wide a step feeds a grammar's forced runs (``decoding/step_cost.py``): learnt from the
steps that ran. Where a step costs per column (a real-size model on a CPU), rows are not padded
to one row's long run; where it costs per step (a small model), the whole runs go at once. The
answers are the same either way: a run cut short is forced again at the next step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from jupyter_infer.constraints.spec import from_body
from jupyter_infer.decoding.step_cost import PROBE_EVERY, StepCost
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

SCHEMA = {"type": "array", "minItems": 6, "maxItems": 6, "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 5}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"], "additionalProperties": False}}


def fed(cost: StepCost, fixed: float, per_column: float, widths: list[int]) -> None:
    for columns in widths:
        cost.add(columns, fixed + per_column * columns)


def test_the_fit_recovers_what_steps_cost_and_waits_until_it_can_tell() -> None:
    cost = StepCost()
    fed(cost, 0.1, 0.008, [16] * 20)
    assert cost.fit() is None  # all of one width: the slope is unknown
    fed(cost, 0.1, 0.008, [16, 40, 16, 120, 16, 64] * 3)
    fixed, per_column = cost.fit()
    assert fixed == pytest.approx(0.1, rel=0.05) and per_column == pytest.approx(0.008, rel=0.05)
    assert StepCost().width([1, 5]) is None and StepCost().fit() is None


def test_compute_bound_steps_stay_narrow_and_overhead_bound_ones_go_wide() -> None:
    runs = [1] * 12 + [10, 6, 3, 2]  # 16 rows: four constrained ones have forced runs
    compute = StepCost()
    fed(compute, 0.1, 0.008, [16, 48, 160, 32] * 4)  # the 0.36 B shape on 2 cores
    overhead = StepCost()
    fed(overhead, 0.005, 0.00002, [16, 48, 160, 32] * 4)  # the tiny model
    assert compute.width(list(runs)) == 1
    assert overhead.width(list(runs)) >= 6  # 6: the four runs mostly fed, padding nearly free
    assert compute.width([1] * 16) is None  # nothing to feed past one token: no decision


def test_narrow_steps_are_probed_while_every_step_is_wide() -> None:
    cost, widths = StepCost(), []
    for _ in range(PROBE_EVERY * 2):
        widths.append(cost.width([4, 4, 1]))
        cost.add(12, 0.2)
    assert widths.count(1) == 2 and widths[PROBE_EVERY - 1] == 1  # the fit cannot tell: no limit but the probes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_answers_are_the_same_whether_forced_runs_go_whole_or_a_token_a_step(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, temperature: float) -> None:
    async def answers(width: int | None) -> list[tuple[str, int]]:
        service = InferenceService(ServiceConfig(engine="hf", model=str(tiny_model_dir), dtype="float32",
                                                 num_threads=1, prefix_cache_mb=0, speculative="off"))
        service.start()
        await service.wait_ready()
        # The ragged forward feeds every run whole (no padding to pay for): a fixed width here,
        # as a forward per bucket would choose one.
        fixed = StepCost()
        monkeypatch.setattr(fixed, "width", lambda runs: width)
        monkeypatch.setattr(service._loop.engine, "step_cost", fixed)
        constraint = from_body({"json_schema": SCHEMA}, native=True)
        streams = [await service.submit(Request(f"List {i}:", SamplingParams(
            max_tokens=200, temperature=temperature, seed=i, constraint=constraint))) for i in range(4)]
        results = [await s.result() for s in streams]
        await service.stop()
        for r in results:
            assert r.finish_reason == "stop" and len(json.loads(r.text)) == 6
        return [(r.text, r.completion_tokens) for r in results]

    # Sampled too: a token the grammar forces takes no draw from the row's generator, fed
    # whole or a token a step, so a seed gives the same answer.
    assert asyncio.run(answers(1)) == asyncio.run(answers(None))
