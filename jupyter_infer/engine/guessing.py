"""How much a row guesses, step after step (speculative decoding, ``speculate.py``).

How many a row proposes follows its acceptance (``Guessing``): twice as many after a run fully
accepted, what was accepted otherwise. Guessing is cheap at one row (on the 2-core CPU a step
that verifies 1 guess costs 1.03x one without, 8 guesses 1.30x, 16 guesses 1.45x) and dear
with many (their guesses add up: a step of 8 rows verifying 2 each reads as 16 rows), so a
step's rows share ``STEP_DRAFT_TOKENS`` (16 each alone or in pairs, 8 in fours, 4 in eights),
and past ``max_rows`` decoding rows nobody proposes. A row whose single guess was wrong sits
out ``COOLDOWN_STEPS`` steps, twice as long after each such miss in a row; while it sits out
it still guesses on paper (prompt lookup costs ~0.1 ms), and the first time its paper guess
is the token its model chose it guesses again at once: a row that falls into repeating
itself (or starts quoting) gets back to guessing in a step, not after its cooldown.
"""

from __future__ import annotations

from typing import NamedTuple

from .ngram import propose

COOLDOWN_STEPS = 8  # steps a row proposes nothing after its one guess was wrong (then 16, 32, ...)
MAX_COOLDOWN_STEPS = 256
STEP_DRAFT_TOKENS = 32  # draft tokens one step verifies at most, over all its rows


class Guessing(NamedTuple):
    """A row's speculation state: how many it proposes next, the steps it still sits out, how
    long it sits out after its next miss, and while sitting out its paper guess (the history
    length it was made at, and the token), if any."""

    k: int
    wait: int = 0
    backoff: int = COOLDOWN_STEPS
    paper: tuple[int, int] | None = None


def sit_out(state: Guessing, history: list[int], on_paper: bool) -> tuple[Guessing, bool]:
    """A step of a row that sits out: its state after it, and whether it guesses this step
    after all (its last paper guess was the token its model chose: back at once, its backoff
    kept until a real guess lands). Otherwise one step less to wait, and a new paper guess
    (prompt lookup only: a draft model's would cost its forwards)."""
    if state.paper is not None and state.paper[0] < len(history) and history[state.paper[0]] == state.paper[1]:
        return Guessing(1, 0, state.backoff), True
    paper = propose(history, 1) if on_paper else []
    return state._replace(wait=state.wait - 1, paper=(len(history), paper[0]) if paper else None), False


def after_verify(state: Guessing, guessed: int, kept: int, most: int) -> Guessing:
    """A row's state after a step verified its ``guessed`` guesses and it kept ``kept``."""
    if kept == guessed:
        return Guessing(min(most, 2 * guessed))
    if kept:
        return Guessing(kept)
    if guessed > 1:
        return Guessing(1, 0, state.backoff)
    # One guess, wrong: sit out, longer each time in a row.
    return Guessing(1, state.backoff, min(2 * state.backoff, MAX_COOLDOWN_STEPS))
