"""Discovery without a real server: the runtime directory, and servers asked in parallel."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from client_helpers import ScriptedServer, answer_json

from jupyter_infer.kernel.client import find_kernel_server
from jupyter_infer.kernel.client.discovery import PROBE_TIMEOUT_S, running_servers


def test_running_servers_are_read_from_the_runtime_dir(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "jpserver-1.json").write_text(json.dumps({"pid": os.getpid(), "url": "http://alive/"}))
    (tmp_path / "jpserver-2.json").write_text(json.dumps({"pid": int(dead.stdout), "url": "http://dead/"}))
    (tmp_path / "jpserver-3.json").write_text('{"pid": 1, "url": ')  # being written
    (tmp_path / "kernel-abc.json").write_text(json.dumps({"pid": os.getpid()}))  # not a server
    assert [s["url"] for s in running_servers(str(tmp_path))] == ["http://alive/"]
    assert (tmp_path / "jpserver-2.json").exists()  # another server's file is not ours to delete
    assert running_servers(str(tmp_path / "missing")) == []


def test_servers_are_asked_for_this_kernel_at_once() -> None:
    """A kernel behind a provisioner: each server's api/kernels is asked, all in parallel."""
    # Each server answers only once all three have been asked (or its probe's time is up): asked
    # one after the other, the first would wait for the others in vain. No wall clock to read.
    all_asked = threading.Barrier(3)
    asked_together: list[bool] = []

    def kernels(ids: list[str]):
        async def script(method: str, path: str, writer: asyncio.StreamWriter) -> None:
            try:
                await asyncio.to_thread(all_asked.wait, PROBE_TIMEOUT_S)
                asked_together.append(True)
            except threading.BrokenBarrierError:
                asked_together.append(False)
            answer_json(writer, [{"id": i} for i in ids])
        return script

    with ScriptedServer(kernels(["k-other"])) as a, ScriptedServer(kernels(["k-mine"])) as b, \
            ScriptedServer(kernels([])) as c:
        servers = [{"url": s.url, "pid": 999_999_990 + i, "token": "t"} for i, s in enumerate((a, b, c))]
        found = find_kernel_server(servers, parent_pid=999_999_999, kernel_id="k-mine")
        assert found is servers[1]
        assert find_kernel_server(servers, parent_pid=999_999_999, kernel_id="k-none") is None
        assert asked_together == [True] * 6, asked_together  # both times, all three at once
