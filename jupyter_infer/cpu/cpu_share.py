"""The engine's share of the CPU beside a busy neighbour (issue 49): how many threads its
steps run, chosen from what the kernel scheduler says, and whether it is starved.

A step's threads meet at a barrier many times (every linear, every layer). With the cores all
taken (the user's notebook computing beside the server), one of them waits in the run queue
while its siblings spin at the barrier for it: a token that took 25 ms took 50–700. Linux
counts, per thread, the time it was runnable but not running (``/proc/<pid>/task/<tid>/
schedstat``, the second field): over a second of steps, that share of our threads' time says
we are starved, whatever the machine or the neighbour. Then a step runs one thread fewer
(down to one, which has no barrier to wait at); when the machine has a whole core idle again
(``/proc/stat``), it takes it back. A thread count the user chose stays as chosen: only the
report changes.

``after_step`` runs on the engine's thread after each step (``torch.set_num_threads`` sets the
calling thread's OpenMP team, which is the one our kernels and torch's ops use there). Reading
the files costs ~0.1 ms, once a second.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

WINDOW_S = 1.0  # how much busy time one decision looks at
STARVED_SHARE = 0.2  # of our threads' runnable time spent waiting for a CPU: starved
IDLE_CORE_SHARE = 0.75  # of a core idle over a window, at fewer threads: take a thread back
HOLD_S = 5.0  # after a change, how long before a thread is taken back (no flapping)

log = logging.getLogger(__name__)


@dataclass
class Reading:
    """Cumulative counters at one moment: our threads' running and waiting nanoseconds, and the
    machine's idle and total CPU time (in ``/proc/stat`` ticks)."""

    run_ns: int
    wait_ns: int
    idle_ticks: int
    total_ticks: int


def read_counters() -> Reading | None:
    """This process's threads (schedstat) and the machine (``/proc/stat``); ``None`` where the
    kernel does not keep them (not Linux, or schedstat off)."""
    run = wait = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                    fields = f.read().split()
            except OSError:  # the thread ended as we looked
                continue
            run, wait = run + int(fields[0]), wait + int(fields[1])
        with open("/proc/stat", "rb") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle and iowait
    return Reading(run, wait, idle, sum(cpu[:8]))


class CpuShare:
    """The engine's threads and whether it is starved; ``adapt``: whether it may change the
    thread count (the user left ``num_threads`` to us)."""

    def __init__(self, threads_max: int, *, adapt: bool = True,
                 read: Callable[[], Reading | None] = read_counters,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 clock: Callable[[], float] = time.monotonic, cores: int | None = None) -> None:
        self.threads_max = max(1, threads_max)
        self.threads = self.threads_max
        self.adapt = adapt
        self.starved = False
        self.waiting_share = 0.0  # the last window's
        self._read, self._set, self._clock = read, set_threads, clock
        self._cores = cores or os.cpu_count() or 1
        self._last = read()
        self._changed_at = -HOLD_S
        self._busy_s = 0.0
        self._stepped_at = clock()

    @property
    def available(self) -> bool:
        return self._last is not None

    def after_step(self, took_s: float) -> None:
        """Count a step's ``took_s`` seconds; once a window of them has passed, decide. Never
        raises: a step that ran must not fail for its bookkeeping (watching stops instead)."""
        if self._last is None:
            return
        try:
            self._count(took_s)
        except Exception:  # noqa: BLE001 - e.g. counters this system writes another way
            log.warning("jupyter_infer: stopped watching the engine's share of the CPU", exc_info=True)
            self._last = None

    def _count(self, took_s: float) -> None:
        now = self._clock()
        if now - took_s - self._stepped_at > WINDOW_S:
            # Idle since the last step: a window over that time would see our own idle core
            # and take a thread back that the neighbour still holds. Start the window here.
            self._last, self._busy_s, self._stepped_at = self._read() or self._last, 0.0, now
            return
        self._stepped_at = now
        self._busy_s += took_s
        if self._busy_s < WINDOW_S:
            return
        reading = self._read()
        if reading is None:
            return
        self._decide(self._last, reading, now)
        self._last, self._busy_s = reading, 0.0

    def _decide(self, was: Reading, now_reading: Reading, now: float) -> None:
        ran, waited = now_reading.run_ns - was.run_ns, now_reading.wait_ns - was.wait_ns
        self.waiting_share = waited / (ran + waited) if ran + waited > 0 else 0.0
        self.starved = self.waiting_share > STARVED_SHARE
        total = now_reading.total_ticks - was.total_ticks
        idle_cores = self._cores * (now_reading.idle_ticks - was.idle_ticks) / total if total > 0 else 0.0
        if not self.adapt:
            return
        if self.starved and self.threads > 1:
            self._change(self.threads - 1, now)
        elif (not self.starved and self.threads < self.threads_max and now - self._changed_at >= HOLD_S
              and idle_cores >= IDLE_CORE_SHARE):
            self._change(self.threads + 1, now)

    def _change(self, threads: int, now: float) -> None:
        self._set(threads)
        self.threads, self._changed_at = threads, now

    def snapshot(self) -> dict:
        """What ``infer/status`` says: the threads in use, and why fewer than chosen."""
        out = {"threads": self.threads, "threads_max": self.threads_max, "adapts": self.adapt,
               "starved": self.starved, "waiting_share": round(self.waiting_share, 3)}
        if not self.available:
            out["note"] = "this system does not say how long our threads wait for a CPU"
        elif self.starved or self.threads < self.threads_max:
            out["note"] = (f"other processes are using this machine's CPUs: our threads spent "
                           f"{self.waiting_share:.0%} of their time waiting for one; the engine runs "
                           f"{self.threads} thread(s) of {self.threads_max}"
                           + ("" if self.adapt else " (num_threads was set, so it keeps them)"))
        return out
