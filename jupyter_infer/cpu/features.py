"""What this CPU can do, read once from Linux's /proc/cpuinfo: which kernels run, and fast."""

from __future__ import annotations

import functools


def cpu_has_vnni() -> bool:
    """AVX512-VNNI or AVX-VNNI: int8 dot products without the 16-bit saturation that makes
    fbgemm narrow the activations' range (``reduce_range``) on plain AVX2."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
