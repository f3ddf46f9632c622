"""Who guesses, and how many, step after step (speculative decoding): the scheduler's policy;
the engine proposes at most that many draft tokens per row (``proposals.drafts``) and verifies
them (``acceptance``), and the step's answer says how many each row kept.

Who: a decoding row whose tokens its model's plain distribution decides. A row that asks for
logprobs does not guess (each of its tokens has its own), nor a sampled row with a seed (its
tokens would then depend on its batch mates: a seed gives the same tokens in any batch), nor
a row with a grammar's forced run to feed (that run is its step). The engine may still
propose fewer, or none: a row whose logits its processors shape (penalties, bias, a grammar)
cannot verify guesses, and prompt lookup may find nothing.

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

from typing import TYPE_CHECKING, NamedTuple, Protocol

from .ngram import propose

if TYPE_CHECKING:
    from ..values.sequence import Sequence
    from ..values.step import RowOutput

COOLDOWN_STEPS = 8  # steps a row proposes nothing after its one guess was wrong (then 16, 32, ...)
MAX_COOLDOWN_STEPS = 256
STEP_DRAFT_TOKENS = 32  # draft tokens one step verifies at most, over all its rows


class SpeculationSettings(Protocol):
    """What the policy reads of the engine (an ``Engine``, set by its
    ``configure_speculation``): where drafts come from ("off", "ngram", "draft"), the most a
    row proposes a step, and the most decoding rows that still propose."""

    speculative_method: str
    speculative_tokens: int
    speculative_max_rows: int


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


class Guesses:
    """The scheduler's speculation policy: each row's ``Guessing``, and each step's guesses."""

    def __init__(self) -> None:
        self.state: dict[str, Guessing] = {}  # by request id; a row that never guessed has none

    def forget(self, ids: list[str]) -> None:
        """The rows in ``ids`` left the engine: their state goes."""
        for row_id in ids:
            self.state.pop(row_id, None)

    def plan(self, engine: SpeculationSettings, decoding: list[Sequence]) -> list[int]:
        """The most draft tokens each of ``decoding`` may propose this step (0: none), from
        the engine's speculation settings (``Engine.configure_speculation``); an empty list
        when no row guesses."""
        tokens = engine.speculative_tokens if engine.speculative_method != "off" else 0
        if not tokens or not decoding or len(decoding) > engine.speculative_max_rows:
            return []
        most = min(tokens, max(1, STEP_DRAFT_TOKENS // len(decoding)))
        on_paper = engine.speculative_method == "ngram"  # a draft model's paper guess costs its forwards
        guesses = [self._guesses(seq, most, on_paper) for seq in decoding]
        return guesses if any(guesses) else []

    def _guesses(self, seq: Sequence, most: int, on_paper: bool) -> int:
        params = seq.params
        if params.logprobs is not None or (not params.greedy and params.seed is not None) or seq.num_uncomputed > 1:
            return 0
        # Tokens it may still get, after this step's own one.
        state = self.state.get(seq.id) or Guessing(most)
        k = min(state.k, most, (params.max_tokens or 0) - len(seq.output_ids) - 1)
        if k <= 0:
            return 0
        if state.wait:
            self.state[seq.id], back = sit_out(state, [*seq.prompt_ids, *seq.output_ids], on_paper)
            if not back:
                return 0
        return k

    def verified(self, seq: Sequence, output: RowOutput, most: int) -> None:
        """After a step verified ``output.proposed`` guesses of ``seq`` (most: the engine's
        ``speculative_tokens``)."""
        if output.proposed:
            state = self.state.get(seq.id) or Guessing(most)
            self.state[seq.id] = after_verify(state, output.proposed, output.accepted, most)
