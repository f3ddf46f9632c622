"""What a decode step costs on this machine and model, learnt from the steps that ran, and the
widest step worth running when rows have runs of several tokens to feed.

A grammar's forced tokens (fast-forward) are fed in one step: each row its run, left-padded to
the longest. Where a step is overhead-bound (a small model), a wide step is nearly free and
every forced token saved is a step saved. Where it is compute-bound (a real-size model on a
CPU: measured ~0.11 s + 7.8 ms a column on the 0.36 B shape), padding 16 rows to one row's run
of 10 costs more than the steps it saves: sampled constrained streams ran at 0.62x free ones.
``StepCost`` fits ``seconds = fixed + per_column * columns`` to recent decode forwards
(least squares with exponential forgetting) and ``width`` picks the step width that feeds the
most tokens a second; a row's run past it is forced again at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

FORGET = 0.05  # weight of the newest step in the running sums
MIN_STEPS = 8  # steps seen before the fit is trusted
# Every this many steps with runs to feed, one feeds a token a row: where every step is wide
# (all rows constrained), the fit would otherwise never see what a narrow one costs.
PROBE_EVERY = 8


@dataclass
class StepCost:
    """Running least-squares fit of a decode forward's seconds against its columns."""

    steps: int = 0
    _asked: int = 0  # width() calls with runs of several tokens
    _x: float = 0.0  # weighted means of columns, seconds, columns^2, columns*seconds
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def add(self, columns: int, seconds: float) -> None:
        a = 1.0 if self.steps == 0 else FORGET
        self._x += a * (columns - self._x)
        self._y += a * (seconds - self._y)
        self._xx += a * (columns * columns - self._xx)
        self._xy += a * (columns * seconds - self._xy)
        self.steps += 1

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_column)`` seconds, or ``None`` while the steps seen cannot tell (too
        few, or all of one width)."""
        variance = self._xx - self._x * self._x
        if self.steps < MIN_STEPS or variance <= 1e-9 * max(self._xx, 1.0):
            return None
        per_column = max((self._xy - self._x * self._y) / variance, 0.0)
        return max(self._y - per_column * self._x, 0.0), per_column

    def width(self, runs: list[int]) -> int | None:
        """The step width (columns a row feeds) that feeds ``runs`` (each row's tokens to
        feed) fastest, every row padded to it; ``None``: no limit (the fit cannot tell)."""
        if max(runs, default=1) <= 1:
            return None
        self._asked += 1
        if self._asked % PROBE_EVERY == 0:
            return 1
        fit = self.fit()
        if fit is None:
            return None
        fixed, per_column = fit
        if per_column == 0.0:
            return None

        def rate(w: int) -> float:
            return sum(min(r, w) for r in runs) / (fixed + per_column * len(runs) * w)

        return max(sorted(set(runs)), key=rate)
