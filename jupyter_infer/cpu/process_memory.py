"""This process's memory as Linux counts it, and handing freed heap back to the system."""

from __future__ import annotations

import ctypes
import functools
import os
import resource


def peak_rss() -> int:
    """This process's peak resident memory so far: Linux's VmHWM. Not ``ru_maxrss``, which
    keeps the high-water mark of the process that started this one (Linux carries it across
    ``exec``): a server started by a big process would report that process's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if os.uname().sysname == "Darwin" else peak * 1024


def release_freed() -> None:
    """Hand freed heap pages back to the system (glibc's ``malloc_trim``). The float weights
    read one at a time are freed between the quantized ones that stay, so the heap cannot
    shrink from its top: without this, loading keeps most of the float checkpoint resident."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


M_ARENA_MAX = -8  # glibc's mallopt parameter


def share_one_heap() -> bool:
    """Have threads started from now on allocate from the heaps that exist instead of each
    making its own (glibc's ``M_ARENA_MAX`` = 1); whether it could (glibc only).

    Each thread that mallocs (the engine's, OpenMP's workers, the tokenizer's) would otherwise
    get an arena of its own, and what bursts of requests free there stays spread over them:
    on the 0.5b shape in int4, 20-40 MB more resident after three bursts, which
    ``malloc_trim`` could not hand back. With one arena the same bursts left it unchanged, and
    a decode step took the same time (docs/engine.md, "Resident memory"). Called before the
    engine's thread starts: a thread keeps the arena it first got."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, 1))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
