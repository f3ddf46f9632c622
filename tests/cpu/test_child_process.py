"""A child started with ``dies_with_parent`` ends when its parent is killed (a test's timeout,
a SIGKILLed bench): nothing is left running with parent 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from jupyter_infer.cpu.child_process import dies_with_parent

PARENT = """
import subprocess, sys, time
from jupyter_infer.cpu.child_process import dies_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=dies_with_parent())
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(dies_with_parent() is None, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_ends_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its killed parent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
