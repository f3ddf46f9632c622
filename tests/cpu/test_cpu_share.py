"""The engine's threads beside a busy neighbour (cpu/cpu_share.py): fewer when its threads wait
for a CPU, one back when a core is idle again, never changed when the user chose them; and the
real counters, read from a process that is made to wait."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from jupyter_infer.cpu import cpu_share
from jupyter_infer.cpu.cpu_share import CpuShare, Reading


class Machine:
    """Counters that advance as a test says: our threads' run and wait, the machine's idle."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reading = Reading(0, 0, 0, 0)

    def advance(self, seconds: float, *, waiting: float, idle_cores: float, cores: int = 2) -> None:
        """``seconds`` pass; our threads wait ``waiting`` of their runnable time; ``idle_cores``
        of the machine's cores are idle."""
        ns = int(seconds * 1e9)
        ticks = int(seconds * 100) * cores
        r = self.reading
        self.reading = Reading(r.run_ns + int(ns * (1 - waiting)), r.wait_ns + int(ns * waiting),
                               r.idle_ticks + int(seconds * 100 * idle_cores), r.total_ticks + ticks)
        self.now += seconds


def share(machine: Machine, *, adapt: bool = True) -> tuple[CpuShare, list[int]]:
    sets: list[int] = []
    return CpuShare(2, adapt=adapt, read=lambda: machine.reading, set_threads=sets.append,
                    clock=lambda: machine.now, cores=2), sets


def steps(s: CpuShare, machine: Machine, seconds: float, *, waiting: float, idle_cores: float) -> None:
    """``seconds`` of back-to-back steps of 0.125 s each."""
    for _ in range(round(seconds / 0.125)):
        machine.advance(0.125, waiting=waiting, idle_cores=idle_cores)
        s.after_step(0.125)


def test_a_starved_engine_runs_a_thread_fewer_and_says_why() -> None:
    machine = Machine()
    s, sets = share(machine)
    steps(s, machine, 2, waiting=0.02, idle_cores=0.0)  # quiet: both cores ours, no waiting
    assert sets == [] and not s.starved and "note" not in s.snapshot()
    steps(s, machine, 1, waiting=0.4, idle_cores=0.0)  # a neighbour: our threads wait 40 %
    assert sets == [1] and s.threads == 1 and s.starved
    snap = s.snapshot()
    assert snap["threads"] == 1 and snap["threads_max"] == 2 and snap["starved"]
    assert "40%" in snap["note"] and "1 thread(s) of 2" in snap["note"]
    # One thread beside the neighbour: no waiting, no idle core: it stays at one.
    steps(s, machine, 10, waiting=0.01, idle_cores=0.0)
    assert sets == [1] and not s.starved and "1 thread(s) of 2" in s.snapshot()["note"]


def test_a_thread_comes_back_when_a_core_is_idle_again_but_not_at_once() -> None:
    machine = Machine()
    s, sets = share(machine)
    steps(s, machine, 1, waiting=0.5, idle_cores=0.0)
    assert sets == [1]
    steps(s, machine, 2, waiting=0.0, idle_cores=1.0)  # the neighbour left: too soon to flap back
    assert sets == [1]
    steps(s, machine, 4, waiting=0.0, idle_cores=1.0)
    assert sets == [1, 2] and s.threads == 2 and "note" not in s.snapshot()


def test_an_idle_spell_is_not_a_free_core() -> None:
    """After the engine sat idle (no steps), its own idle core must not read as the
    neighbour having left."""
    machine = Machine()
    s, sets = share(machine)
    steps(s, machine, 1, waiting=0.5, idle_cores=0.0)
    machine.advance(30, waiting=0.0, idle_cores=1.0)  # no requests for 30 s; the neighbour runs on
    steps(s, machine, 1.5, waiting=0.0, idle_cores=0.05)
    assert sets == [1]


def test_a_count_the_user_chose_is_kept_and_the_starving_still_reported() -> None:
    machine = Machine()
    s, sets = share(machine, adapt=False)
    steps(s, machine, 3, waiting=0.6, idle_cores=0.0)
    assert sets == [] and s.threads == 2 and s.starved
    assert "num_threads was set" in s.snapshot()["note"]


def test_counters_it_cannot_read_stop_the_watching_not_the_step() -> None:
    machine = Machine()
    s, sets = share(machine)
    s._read = lambda: Reading(0, 0, 0, 0) if machine.now < 0.5 else (_ for _ in ()).throw(RuntimeError("odd /proc"))
    steps(s, machine, 2, waiting=0.5, idle_cores=0.0)  # the window's read raises: no exception here
    assert sets == [] and not s.available and "does not say" in s.snapshot()["note"]


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat here")
def test_the_real_counters_see_a_thread_wait_for_a_cpu() -> None:
    """This process pinned to one CPU beside two busy children pinned there too: its thread
    waits about two thirds of its runnable time, and the counters say so."""
    cpu = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    ctx = multiprocessing.get_context("fork")  # children inherit the one-CPU affinity
    children = [ctx.Process(target=_spin, args=(3.0,)) for _ in range(2)]
    try:
        for child in children:
            child.start()
        time.sleep(0.2)
        was = cpu_share.read_counters()
        _spin(1.0)
        now = cpu_share.read_counters()
    finally:
        for child in children:
            child.terminate()
            child.join()
        os.sched_setaffinity(0, before_affinity)
    assert was is not None and now is not None
    ran, waited = now.run_ns - was.run_ns, now.wait_ns - was.wait_ns
    assert waited / (ran + waited) > cpu_share.STARVED_SHARE
