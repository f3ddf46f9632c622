"""How the server's process keeps its memory (cpu/process_memory.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_infer.cpu import process_memory

# A thread started after the call mallocs, keeps it, and the process counts glibc's heaps
# (``malloc_info``'s ``<heap nr=...>``): one per arena in use.
HEAPS = """
import ctypes, sys, threading
from jupyter_infer.cpu import process_memory
if sys.argv[1] == "shared":
    assert process_memory.share_one_heap()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
kept = []
thread = threading.Thread(target=lambda: kept.extend(libc.malloc(4096) for _ in range(4000)))
thread.start()
thread.join()
out = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, out)
libc.fclose(out)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or process_memory._libc() is None, reason="glibc's malloc")
@pytest.mark.parametrize("mode", ["shared", "default"])
def test_threads_started_after_share_one_heap_allocate_from_the_same_heap(tmp_path: Path, mode: str) -> None:
    report = tmp_path / "malloc_info.xml"
    subprocess.run([sys.executable, "-c", HEAPS, mode, str(report)], check=True, timeout=120)
    heaps = report.read_text().count("<heap nr=")
    assert heaps == 1 if mode == "shared" else heaps >= 2
