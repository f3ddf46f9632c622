"""Plans for tests that drive an engine directly, step by step, as the scheduler would."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_infer.engine import Engine, StepPlan
from jupyter_infer.values.sequence import Sequence


def keeping(engine: Engine, step_id: int, seqs: list[Sequence], keep: Iterable[str] = (),
            num_scheduled: list[int] | None = None, **more: Any) -> StepPlan:
    """A plan of ``seqs`` after which, of the rows the engine holds, only those in ``keep``
    stay: the others leave first (the scheduler's ``finished``)."""
    kept = set(keep)
    return StepPlan.of(step_id, seqs, num_scheduled,
                       finished=[i for i in engine.held_rows().ids if i not in kept], **more)
