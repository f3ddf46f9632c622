"""A serving engine started as a child and served through (engine = "vllm" | "llama.cpp" |
"sglang" | "command"): here a real child, our own ``jupyter infer serve``; answered through our
front, restarted after a kill, stopped with the service (no orphan process)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from jupyter_infer.errors import EngineUnavailable
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.upstream.managed_server import ManagedServer
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

pytestmark = pytest.mark.timeout(180)

# Its token comes in JUPYTER_TOKEN, where ps does not show it.
OUR_SERVE = (f"{sys.executable} -m jupyter_infer.commands.cli serve --engine simulated --port {{port}} "
             "--ip 127.0.0.1 --no-hub")


async def ask(service: InferenceService) -> str:
    stream = await service.submit(Request("What is batching?", SamplingParams(max_tokens=4)))
    return (await stream.result()).text


def alive(group: int) -> bool:
    """Whether any process of the group ``group`` (the child and what it started) is left."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.asyncio
async def test_a_child_server_answers_through_the_front_comes_back_after_a_kill_and_stops_with_it() -> None:
    service = InferenceService(ServiceConfig(engine="command", serve_command=OUR_SERVE, serve_api_path="/infer/v1",
                                             serve_start_timeout_s=120))
    service.start()
    try:
        assert service.state in ("starting", "ready")
        await service.wait_ready(150)
        assert await ask(service)
        child = service.status()["child_server"]
        assert child["state"] == "ready" and child["restarts"] == 0 and service.child.token not in str(child)
        with open(f"/proc/{child['pid']}/cmdline", "rb") as f:
            assert service.child.token.encode() not in f.read()  # not on its command line either
        first = child["pid"]
        os.killpg(first, signal.SIGKILL)  # it dies: restarted, at the same port
        # Requests sent throughout the restart wait for it and are answered (they were 503s, one
        # naming InferApp.upstream_url, never set); status never says ready while it cannot serve.
        sent, seen = [], []
        for _ in range(600):
            seen.append((service.state, service.child.serving))
            if len(sent) < 8:
                sent.append(asyncio.ensure_future(ask(service)))
            if service.child.state == "ready" and service.child.pid != first:
                break
            await asyncio.sleep(0.1)
        assert service.child.restarts == 1 and service.child.state == "ready"
        assert ("restarting", False) in seen and not [s for s in seen if s == ("ready", False)], seen
        assert all(await asyncio.gather(*sent))
        assert await ask(service) and service.state == "ready"
        second = service.child.pid
    finally:
        await service.stop()
    assert not alive(second) and service.child.state == "stopped"


@pytest.mark.asyncio
async def test_an_engine_that_is_not_installed_fails_saying_how_to_install_it() -> None:
    service = InferenceService(ServiceConfig(engine="vllm", model="Qwen/Qwen2.5-0.5B-Instruct"))
    service.start()
    try:
        with pytest.raises(EngineUnavailable, match=r"vllm was not found on PATH: pip install vllm"):
            await service.wait_ready(30)
        assert service.status()["state"] == "failed" and service.status()["child_server"]["state"] == "failed"
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_llama_cpp_given_a_checkpoint_folder_says_it_needs_a_gguf_file(tiny_model_dir) -> None:
    """It failed in llama-server's words ("failed to read magic") after a start."""
    service = InferenceService(ServiceConfig(engine="llama.cpp", model=str(tiny_model_dir)))
    service.start()
    try:
        with pytest.raises(EngineUnavailable, match=r"llama.cpp serves a .gguf file, and .* is a folder: convert"):
            await service.wait_ready(30)
    finally:
        await service.stop()


def test_the_context_length_reaches_the_child_as_its_own_flag() -> None:
    for kind, flag in (("llama.cpp", "-c"), ("vllm", "--max-model-len"), ("sglang", "--context-length")):
        assert [flag, "4096"] == ManagedServer(kind, "m.gguf", max_model_len=4096).command[-2:]
    assert "-c" not in ManagedServer("llama.cpp", "m.gguf").command


def test_the_log_folder_of_a_child_whose_server_died_is_swept_at_the_next_start() -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = Path(tempfile.mkdtemp(prefix="jupyter-infer-child-"))
    (stale / "owner.pid").write_text(str(gone.pid))
    (stale / "server.log").write_text("a log")
    live = ManagedServer("llama.cpp", "m.gguf")
    assert not stale.exists() and Path(live.log_path).parent.is_dir()  # ours stays


@pytest.mark.asyncio
async def test_a_child_is_a_model_shelf_switched_and_unloaded_by_restarting_it(tiny_model_dir, tmp_path) -> None:
    """POST infer/models said 'This server does not run its model itself … switch models there',
    but 'there' was our own child: a load restarts it with the new model, an unload stops it
    (its memory back), and the next request starts it again."""
    import shutil

    for name in ("first", "second"):
        shutil.copytree(tiny_model_dir, tmp_path / name)
    # The simulated engine in the child (it starts in seconds; the model it is given is in its command line).
    command = (f"{sys.executable} -m jupyter_infer.commands.cli serve --engine simulated --model {{model}} "
               "--port {port} --ip 127.0.0.1 --no-hub")
    service = InferenceService(ServiceConfig(engine="command", model=str(tmp_path / "first"), serve_command=command,
                                             serve_api_path="/infer/v1", serve_start_timeout_s=120,
                                             model_dirs=(str(tmp_path),)))
    service.start()
    try:
        await service.wait_ready(150)
        first_pid = service.child.pid
        listed = {m["id"]: m for m in service.models.listing()}
        assert listed["first"]["loaded"] and not listed["second"]["loaded"] and "simulated" not in listed
        await service.models.load("second")
        assert service.child.pid != first_pid and not alive(first_pid)  # the old child is gone
        assert str(tmp_path / "second") in service.status()["child_server"]["command"]
        assert {m["id"]: m["loaded"] for m in service.models.listing()}["second"]
        assert await ask(service)
        status = service.status()
        assert (status["engine"], status["managed"]) == ("command", True)
        second_pid = service.child.pid
        await service.models.unload()
        assert service.state == "unloaded" and not alive(second_pid)
        assert await ask(service)  # the next request starts it again
        assert service.child.pid not in (None, second_pid) and service.state == "ready"
    finally:
        await service.stop()
