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


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
