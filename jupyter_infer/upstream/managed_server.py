"""A serving engine started as a child of the Jupyter server: vLLM, llama.cpp's ``llama-server``,
SGLang, or any command (``engine = "vllm" | "llama.cpp" | "sglang" | "command"``).

It listens on a free loopback port with the chosen model; this front serves through it as it
does any upstream (``engine = "openai"``: the queue, fairness, limits, timeline, structured
outputs forwarded). The child is waited for (its ``v1/models`` answering), restarted with
backoff if it dies, and stopped with Jupyter: its process group is ended, and on Linux the
kernel ends it too if the Jupyter server dies first (``PR_SET_PDEATHSIG``), so no orphan is left
holding a GPU. Its log goes to a file; the last lines are in ``infer/status`` and in the reason
a start failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from ..cpu.child_process import dies_with_parent

# The command each engine starts ({model}, {port}, {token} filled in) and where its API is.
# vLLM and llama-server read the key from their environment (VLLM_API_KEY, LLAMA_API_KEY), where
# ``ps`` does not show it; SGLang only takes it as an argument.
COMMANDS = {
    "vllm": ("vllm serve {model} --host 127.0.0.1 --port {port}", "/v1"),
    "llama.cpp": ("llama-server -m {model} --host 127.0.0.1 --port {port}", "/v1"),
    "sglang": (f"{shlex.quote(sys.executable)} -m sglang.launch_server --model-path {{model}} --host 127.0.0.1 "
               "--port {port} --api-key {token}", "/v1"),
}
INSTALL = {"vllm": "pip install vllm (on a CUDA machine)",
           "llama.cpp": "build llama.cpp (docs/benchmark.md) and put llama-server on PATH",
           "sglang": "pip install 'sglang[all]' (on a CUDA machine)"}
BACKOFF_S = (1.0, 30.0)  # between restarts: first and longest
LOG_TAIL = 20
log_line = logging.getLogger(__name__)


class ManagedServer:
    def __init__(self, kind: str, model: str, *, command: str = "", args: tuple[str, ...] = (),
                 api_path: str = "", start_timeout_s: float = 600.0) -> None:
        template, default_path = COMMANDS.get(kind, ("", "/v1"))
        self.kind = kind
        self.port = _free_port()
        self.token = secrets.token_hex(16)  # its API key: only this front talks to it
        self.command = [*shlex.split((command or template).format(
            model=shlex.quote(model), port=self.port, token=self.token)), *args]
        self.url = f"http://127.0.0.1:{self.port}{api_path or default_path}"
        self.start_timeout_s = start_timeout_s
        self.state = "stopped"  # stopped | starting | ready | restarting | failed
        self.restarts = 0
        self.error: str | None = None
        self._log_dir = tempfile.TemporaryDirectory(prefix="jupyter-infer-child-")
        self.log_path = Path(self._log_dir.name) / "server.log"
        self._proc: subprocess.Popen | None = None
        self._watch: asyncio.Task | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the child and wait until it answers; raises ``RuntimeError`` saying why not
        (not installed, exited, or not up within ``start_timeout_s``, with its last log lines)."""
        if not self.command or shutil.which(self.command[0]) is None:
            self._fail(f"{self.command[0] if self.command else 'no command'} was not found on PATH: "
                       f"{INSTALL.get(self.kind, 'set InferApp.serve_command to the command that starts it')}.")
        self.state = "starting"
        self._spawn()
        await self._until_up()
        self.state = "ready"
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name="jupyter-infer-child")

    async def stop(self) -> None:
        """End the child (its whole process group): SIGTERM, then SIGKILL after 5 s."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        proc, self._proc = self._proc, None
        await _end(proc)
        self.state = "stopped"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def status(self) -> dict[str, Any]:
        """For ``infer/status``: what runs, where, how it goes, and its last log lines (the
        API key left out)."""
        shown = [part.replace(self.token, "<key>") for part in self.command]
        return {"kind": self.kind, "command": shlex.join(shown), "pid": self.pid, "url": self.url,
                "state": self.state, "restarts": self.restarts, "error": self.error,
                "log": str(self.log_path), "log_tail": self.log_tail()}

    def log_tail(self, lines: int = LOG_TAIL) -> list[str]:
        """Its last log lines, the key hidden (an engine may log its own arguments)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return [line.rstrip("\n").replace(self.token, "<key>") for line in deque(f, maxlen=lines)]
        except OSError:
            return []

    # -- inside -----------------------------------------------------------------------------
    def _spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child holds it; closed when it ends)
        try:
            # The key in its environment too: vLLM and llama-server read it there, and a
            # `jupyter infer serve` child takes JUPYTER_TOKEN (no {token} on its command line).
            env = {**os.environ, "VLLM_API_KEY": self.token, "LLAMA_API_KEY": self.token,
                   "LLAMA_ARG_API_KEY": self.token, "JUPYTER_TOKEN": self.token}
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True, preexec_fn=dies_with_parent())
        finally:
            log.close()
        log_line.info("jupyter_infer | %s started (pid %d, port %d): %s", self.kind, self._proc.pid, self.port,
                      shlex.join(part.replace(self.token, "<key>") for part in self.command))

    async def _until_up(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(timeout=5.0, headers=headers) as client:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = self._proc.returncode if self._proc is not None else None
                    self._fail(f"{self.kind} exited (code {code}) before it answered")
                try:
                    if (await client.get(f"{self.url}/models")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    proc, self._proc = self._proc, None
                    await _end(proc)  # (not stop(): the supervisor may be the caller)
                    self._fail(f"{self.kind} did not answer within {self.start_timeout_s:g} s "
                               "(InferApp.serve_start_timeout_s)")
                await asyncio.sleep(0.25)

    async def _supervise(self) -> None:
        """Restart the child when it dies, waiting longer each time (1 s, 2 s, ... 30 s)."""
        wait = BACKOFF_S[0]
        while True:
            await asyncio.sleep(0.5)
            if self._proc is None or self._proc.poll() is None:
                continue
            self.state, self.restarts = "restarting", self.restarts + 1
            self.error = f"{self.kind} exited (code {self._proc.returncode}); restarting in {wait:g} s"
            log_line.warning("jupyter_infer | %s (its log: %s)", self.error, self.log_path)
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF_S[1])
            await _end(self._proc)  # what is left of its group (workers holding a GPU) goes first
            try:
                self._spawn()
                await self._until_up()
            except Exception:  # failed again (or could not even start): the next round waits longer
                continue
            self.state, self.error, wait = "ready", None, BACKOFF_S[0]
            log_line.info("jupyter_infer | %s is back (restart %d)", self.kind, self.restarts)

    def _fail(self, why: str) -> None:
        tail = self.log_tail(8)
        self.state = "failed"
        self.error = why + (": ..." + " | ".join(tail) if tail else "") + \
            (f" (its log: {self.log_path})" if self.log_path.is_file() else "")
        log_line.error("jupyter_infer | the %s server did not start: %s", self.kind, self.error)
        raise RuntimeError(self.error)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _end(proc: subprocess.Popen | None) -> None:
    """SIGTERM to ``proc``'s whole process group, SIGKILL after 5 s; the group is ended even
    when its leader is gone already (an engine's workers may outlive it)."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, 5)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.to_thread(proc.wait)

