"""How loading a model goes: the phase, how far it is, how long it took and is likely to take.

The loader (on the engine's thread) says where it is (``phase``, ``advance``); anyone reads a
``snapshot`` (``infer/status``'s ``loading``, the lab panel, ``%infer_status``), and the log
gets a line at each phase and every few seconds within a long one. The loader finds the
progress of its thread with ``current()`` (set by ``reporting``), so that the formats and the
kernels' build need no argument threaded through every call: where nothing reports, the calls
cost nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

LOG_EVERY_S = 5.0  # a long phase logs how far it is at most this often


class LoadProgress:
    def __init__(self, model: str, log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._log = log
        self._clock = clock
        self.started_at = clock()
        self.phase_name = "starting"
        self.done = 0
        self.total = 0  # 0: not counted
        self.unit = ""
        self._phase_at = self.started_at
        self._logged_at = self.started_at
        self.phases: list[tuple[str, float]] = []  # the finished ones, with their seconds
        self.finished_at: float | None = None  # the load's end: its clock stops there

    def phase(self, name: str, total: int = 0, unit: str = "") -> None:
        """Enter the next phase (``total`` ``unit``s to do, where it counts them)."""
        now = self._clock()
        if self.phase_name != "starting":
            self.phases.append((self.phase_name, now - self._phase_at))
        self.phase_name, self.done, self.total, self.unit = name, 0, total, unit
        self._phase_at = self._logged_at = now
        self._say(f"{name}" + (f" ({total} {unit})" if total else ""))

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self._clock()
        if self.total and now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            left = self.left_s()
            self._say(f"{self.phase_name}: {self.done} of {self.total} {self.unit}"
                      + (f", about {left:.0f} s left" if left is not None else ""))

    def finish(self, failed: bool = False) -> None:
        """The load ended (``failed``: with an error): its clock stops (status and
        ``%infer_status`` say what it took, not the time since)."""
        if self.finished_at is not None:
            return
        self.finished_at = self._clock()
        if self.phase_name != "starting":
            self.phases.append((self.phase_name, self.finished_at - self._phase_at))
        self.phase_name = "failed" if failed else "done"

    def left_s(self) -> float | None:
        """This phase's seconds left at its pace so far (None: not counted, or too early)."""
        if not self.total or not self.done:
            return None
        spent = self._clock() - self._phase_at
        return spent / self.done * (self.total - self.done)

    def snapshot(self) -> dict[str, Any]:
        now = self._clock() if self.finished_at is None else self.finished_at
        left = self.left_s() if self.finished_at is None else None
        return {
            "model": self.model,
            "phase": self.phase_name,
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "elapsed_s": round(now - self.started_at, 1),
            "phase_s": round(now - self._phase_at, 1),
            "phase_left_s": None if left is None else round(left, 1),
            "phases": [{"phase": name, "s": round(s, 2)} for name, s in self.phases],
        }

    def _say(self, what: str) -> None:
        if self._log is not None:
            self._log(f"loading {self.model}: {what} [{self._clock() - self.started_at:.1f} s]")


_local = threading.local()


@contextlib.contextmanager
def reporting(progress: LoadProgress) -> Iterator[LoadProgress]:
    """Within this block, this thread's loaders report to ``progress``."""
    before = getattr(_local, "progress", None)
    _local.progress = progress
    try:
        yield progress
    finally:
        _local.progress = before


def current() -> LoadProgress:
    """The progress this thread's load reports to (a silent one where none listens)."""
    return getattr(_local, "progress", None) or LoadProgress("")
