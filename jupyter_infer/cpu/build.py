"""Building the CPU kernel library (``csrc/``): compiled at first use with the machine's C
compiler for this CPU (``-march=native``) into the user's cache, and *probed in a child
process* before this process loads it.

The probe (``ji_probe`` in ``csrc/probe.c``) runs every kind of kernel once on made-up inputs.
A CPU can advertise an instruction its virtual machine does not run (AMX on some cloud VMs:
llama.cpp's own ``-march=native`` build dies there with SIGILL); such a kernel would take the
whole Jupyter server down with it, kernels and all. In the child it only kills the child: the
library is refused, saying why, and the server serves on the float path (oneDNN or eager).
``JUPYTER_INFER_KERNEL_CFLAGS`` adds compiler flags (``-mno-amx-tile``, ``-mno-avx512f``) for
such a machine; they are part of the build's key, as is every source byte and the CPU's flags.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

from ..values.request import brief
from .features import cpu_flags

NEEDED_FLAGS = frozenset({"avx2", "fma", "f16c"})
CSRC = pathlib.Path(__file__).with_name("csrc")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
PROBE_TIMEOUT_S = 60
# The child loads the library and runs its self-test: nothing of ours, no torch (a second
# OpenMP runtime is fine in a process of its own).
_PROBE = "import ctypes, sys; sys.exit(ctypes.CDLL(sys.argv[1]).ji_probe())"


def cache_dir() -> pathlib.Path:
    home = os.environ.get("JUPYTER_INFER_HOME")
    base = pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "jupyter_infer"
    return base / "kernels"


def sources() -> list[pathlib.Path]:
    return sorted(CSRC.glob("*.c"))


def user_flags() -> list[str]:
    """Extra compiler flags the user asked for (``JUPYTER_INFER_KERNEL_CFLAGS``)."""
    return shlex.split(os.environ.get("JUPYTER_INFER_KERNEL_CFLAGS", ""))


def library_key(compiler: str | None = None, extra_flags: tuple[str, ...] = ()) -> str:
    """The key of the library this machine builds (or built): every source byte, the compiler,
    the flags and the CPU's. The build is for this CPU: its flags are part of the key, so a
    cache shared between machines (a home directory on a cluster) never hands one CPU another's
    build."""
    compiler = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "none"
    source = b"".join(path.read_bytes() for path in [*sources(), *sorted(CSRC.glob("*.h"))])
    flags = [*FLAGS, *extra_flags, *user_flags()]
    return hashlib.sha256(source + " ".join([compiler, *flags, *sorted(_cpu_key())]).encode()).hexdigest()[:16]


def build(extra_flags: tuple[str, ...] = ()) -> pathlib.Path | str:
    """The built library, probed, or why there is none. ``extra_flags``: a build for less than
    this CPU has (the tests check the AVX2 path on an AVX-512 machine with ``-mno-avx512f``)."""
    if sys.platform != "linux" or not NEEDED_FLAGS <= cpu_flags():
        missing = ", ".join(sorted(NEEDED_FLAGS - cpu_flags())) or "Linux"
        return f"our CPU kernels need an x86 CPU with AVX2, FMA and F16C on Linux (missing: {missing})"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return "our CPU kernels are built at first use with a C compiler, and none was found (set CC)"
    files = sources()
    flags = [*FLAGS, *extra_flags, *user_flags()]
    target = cache_dir() / f"cpu-kernels-{library_key(compiler, extra_flags)}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = pathlib.Path(tmp) / target.name
            done = subprocess.run([compiler, *flags, f"-I{CSRC}", "-o", str(built), *map(str, files)],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return f"building our CPU kernels with {compiler} failed: {brief(done.stderr)}"
            os.replace(built, target)  # atomic: a concurrent build never loads half a file
    why = probe(target)
    return target if why is None else why


def probe(library: pathlib.Path) -> str | None:
    """Run the library's self-test in a child process: ``None`` when it passed, else why not."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _PROBE, str(library)], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"our CPU kernels' self-test did not finish in {PROBE_TIMEOUT_S} s; they are not used"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return (f"our CPU kernels' self-test died with {name} on this CPU, so they are not used "
                "(an instruction the CPU advertises that this machine does not run, as AMX in some "
                "VMs); the float path serves instead. Set JUPYTER_INFER_KERNEL_CFLAGS (e.g. "
                "'-mno-amx-tile -mno-avx512f') to build them without it.")
    return (f"our CPU kernels' self-test failed (exit {done.returncode}: "
            f"{(done.stderr.strip() or 'non-finite outputs')[-200:]}); they are not used")


def _cpu_key() -> frozenset[str]:
    return frozenset(f for f in cpu_flags() if f.startswith(("avx", "fma", "f16c", "amx")))
