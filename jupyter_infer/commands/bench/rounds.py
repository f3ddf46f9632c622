"""Measuring contenders on one workload: a warm-up each, then timed rounds, round-robin.

Every section of the bench measures this way (``Suite`` and the CPU section, ``cpu``); each
returns what it measured and the suite keeps the results.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from .contenders import Contender, Run, in_fresh_thread
from .workloads import Workload


def measure_rounds(workload: Workload, contenders: list[Contender], repeats: int, log: Callable[[str], None],
                   warmup: bool = True) -> dict[str, Any]:
    """Warm every contender up (not counted), then ``repeats`` interleaved rounds (a workload
    with ``fresh`` prompts gets new ones every round, the same for every contender).

    Returns, for each contender that supports the workload, its label, the median of every
    statistic over the rounds and every round's statistics, by contender name."""
    active = [c for c in contenders if c.supports(workload)]
    for c in active if warmup else []:
        t = time.perf_counter()
        in_fresh_thread(c.warmup, workload.for_round(0))
        log(f"  {workload.name:<6} {c.label:<34} warm-up {time.perf_counter() - t:6.2f} s")
    runs: dict[str, list[Run]] = {c.name: [] for c in active}
    for round_ in range(repeats):
        # Round-robin, so that a slow spell of a shared machine hits everyone alike.
        this_round = workload.for_round(round_ + 1)
        for c in active:
            pids = c.pids()  # the server under test: its CPU is the contender's own, not noise
            before = _cpu_sample(pids)
            run = in_fresh_thread(c.run, this_round)
            run.extra["other_cpu_share"] = _other_cpu_share(before, _cpu_sample(pids))
            runs[c.name].append(run)
            log(f"  {workload.name:<6} {c.label:<34} run {round_ + 1}/{repeats}: {_run_line(c, run)}")
    return {c.name: {"label": c.label, "median": _median_stats(runs[c.name]), "runs": [r.stats() for r in runs[c.name]]}
            for c in active}


def _run_line(contender: Contender, run: Run) -> str:
    s = run.stats()
    ttft = "" if s["ttft_p50_ms"] is None else f"  TTFT p50 {s['ttft_p50_ms']:8.1f} ms"
    other = s["other_cpu_share"]
    noise = "" if other is None else f"  (other processes: {other:.0%} CPU)"
    return f"{s['tokens_per_s']:8.1f} tok/s{ttft}{noise}"


def _cpu_sample(pids: list[int] = ()) -> tuple[float, float, float] | None:
    """(wall s, busy CPU-seconds of the whole machine, CPU-seconds of this process and of
    ``pids``, the servers under test); Linux only."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait
    except (OSError, ValueError, IndexError):
        return None
    t = os.times()
    return time.monotonic(), busy, t.user + t.system + sum(_process_cpu_s(pid) for pid in pids)


def _process_cpu_s(pid: int) -> float:
    """CPU-seconds process ``pid`` and its waited-for children used (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
        return 0.0


def _other_cpu_share(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> float | None:
    """The share of the machine's CPUs that other processes used meanwhile: a noise gauge."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, min(1.0, others / ((after[0] - before[0]) * (os.cpu_count() or 1))))


def _median_stats(runs: list[Run]) -> dict[str, Any]:
    """The median of every numeric statistic over the repeats."""
    stats = [r.stats() for r in runs]
    out: dict[str, Any] = {}
    for key in stats[0]:
        values = [s[key] for s in stats if isinstance(s.get(key), (int, float))]
        out[key] = statistics.median(values) if values else None
    return out
