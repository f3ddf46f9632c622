"""The simulated engine stepped directly, as the engine loop steps it: what a step costs."""

from __future__ import annotations

from jupyter_infer.engine import StepPlan
from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Sequence


def test_a_chunked_prompt_costs_the_simulated_engine_what_it_costs_whole() -> None:
    """The simulated engine's prefill time grows with the prompt tokens computed: in chunks,
    each chunk costs its own tokens (a precedence slip once made every chunk after the
    first cost nothing, and the interference it demonstrates vanished)."""
    engine = SimulatedEngine(prefill_ms_per_token=2.0, prefill_base_ms=0.0)
    slept: list[float] = []
    engine.spend_ms = slept.append
    seq = Sequence(Request("x", SamplingParams(max_tokens=8)), list(range(1, 101)))
    while True:
        [output] = engine.execute(StepPlan.of(1, [seq], [64]))
        if output.tokens:
            break
        seq.num_computed = output.computed
    assert slept == [128.0, 72.0]  # 64 tokens, then the 36 left
