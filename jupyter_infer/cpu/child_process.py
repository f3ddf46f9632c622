"""Child processes that die with the process that started them: a server a test, the bench,
the demo or the managed engine starts is ended by the kernel when its parent dies (a test's
timeout, a SIGKILL), so none is left running with parent 1.

Linux's ``PR_SET_PDEATHSIG`` (elsewhere nothing is done): the signal comes when the *thread*
that started the child ends, so start long-lived children from a thread that lives as long
as they should (the main thread, or the event loop's).
"""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


def _prctl() -> Any:
    """libc's prctl, looked up here in the parent: the forked child only calls it (loading a
    library between fork and exec in a threaded server could deadlock)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def dies_with_parent() -> Callable[[], None] | None:
    """The ``preexec_fn`` for ``subprocess.Popen`` (or ``asyncio.create_subprocess_exec``)
    that ends the child with its parent; ``None`` where the system has no such thing."""
    return _die_with_parent if _PRCTL is not None else None
