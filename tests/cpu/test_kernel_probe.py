"""Our CPU kernel library is probed in a child process before the server loads it
(``cpu/build.py``): a library that faults there (an instruction the CPU advertises but the
machine does not run, as AMX in some VMs) is refused, saying why, and the server serves on the
float path instead of dying with it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jupyter_infer.cpu import build, kernels
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


@pytest.fixture
def faulting_library(monkeypatch: pytest.MonkeyPatch):
    """Our kernels built so that their self-test dies with SIGILL (``-DJI_PROBE_TRAP``)."""
    monkeypatch.setenv("JUPYTER_INFER_KERNEL_CFLAGS", "-DJI_PROBE_TRAP")
    kernels.load.cache_clear()
    yield
    monkeypatch.delenv("JUPYTER_INFER_KERNEL_CFLAGS")
    kernels.load.cache_clear()  # the good build again (cached on disk: a probe, no compile)


def test_the_probe_runs_every_kernel_in_a_child_and_passes_here() -> None:
    built = build.build()
    assert isinstance(built, Path) and build.probe(built) is None
    assert kernels.status().startswith("ours")


@pytest.mark.usefixtures("faulting_library")
def test_a_library_that_faults_in_its_probe_is_refused_and_this_process_lives() -> None:
    why = kernels.unavailable()
    assert why is not None and signal.SIGILL.name in why and "JUPYTER_INFER_KERNEL_CFLAGS" in why
    assert kernels.status() == f"not used: {why}"
    with pytest.raises(RuntimeError, match="SIGILL"):
        kernels.library()


@pytest.mark.asyncio
@pytest.mark.usefixtures("faulting_library")
async def test_the_server_serves_on_the_float_path_and_its_status_says_why(tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir), dtype="float32", num_threads=1)
    service = InferenceService(ServiceConfig(), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    try:
        details = service.status()["details"]
        assert "SIGILL" in details["cpu_kernels"] and details["cpu_kernels"].startswith("not used")
        assert "ours" not in details["linear_kernels"]  # oneDNN's prepacked float32 serves
        stream = await service.submit(Request("Tell me about batching", SamplingParams(max_tokens=8)))
        result = await stream.result()
        assert result.completion_tokens > 0
    finally:
        await service.stop()


def test_a_model_that_does_not_use_them_costs_no_build_nor_probe(tiny_model_dir: Path) -> None:
    """infer/status names our kernels' state without building them for it: eager linears
    (``prepack_weights=False``) load no library and run no probe child."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from jupyter_infer.cpu import build, kernels\n"
              "from jupyter_infer.engine.hf import HFEngine\n"
              "build.build = lambda *a: sys.exit('built or probed')\n"
              "e = HFEngine(sys.argv[1], dtype='float32', num_threads=1, prepack_weights=False)\n"
              "print(e.info.details['cpu_kernels'])\n")
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("not loaded")
