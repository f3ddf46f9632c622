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
from ..errors import EngineUnavailable

# The command each engine starts ({model}, {port}, {token} filled in) and where its API is.
# vLLM and llama-server read the key from their environment (VLLM_API_KEY, LLAMA_API_KEY), where
# ``ps`` does not show it; SGLang only takes it as an argument.
COMMANDS = {
    "vllm": ("vllm serve {model} --host 127.0.0.1 --port {port}", "/v1"),
    "llama.cpp": ("llama-server -m {model} --host 127.0.0.1 --port {port}", "/v1"),
    "sglang": (f"{shlex.quote(sys.executable)} -m sglang.launch_server --model-path {{model}} --host 127.0.0.1 "
               "--port {port} --api-key {token}", "/v1"),
}
# How each takes InferApp.max_model_len.
CONTEXT_FLAGS = {"vllm": "--max-model-len", "llama.cpp": "-c", "sglang": "--context-length"}
INSTALL = {"vllm": "pip install vllm (on a CUDA machine)",
           "llama.cpp": "build llama.cpp (docs/benchmark.md) and put llama-server on PATH",
           "sglang": "pip install 'sglang[all]' (on a CUDA machine)"}
# Where each says it has loaded its model (llama-server's and SGLang's answer 503 while loading;
# its v1/models may answer before); after it, v1/models must answer too.
HEALTH = {"vllm": "/health", "llama.cpp": "/health", "sglang": "/health"}
BACKOFF_S = (1.0, 30.0)  # between restarts: first and longest
WATCH_EVERY_S = 0.2  # how often the supervisor looks whether the child is alive
LOG_TAIL = 20
FOLDER_PREFIX = "jupyter-infer-child-"  # each child's log folder, in the temp folder
OWNER_FILE = "owner.pid"  # the pid of the Jupyter server that started it
log_line = logging.getLogger(__name__)


class ManagedServer:
    def __init__(self, kind: str, model: str, *, command: str = "", args: tuple[str, ...] = (),
                 api_path: str = "", start_timeout_s: float = 600.0, max_model_len: int = 0) -> None:
        template, default_path = COMMANDS.get(kind, ("", "/v1"))
        self.kind = kind
        self.model = model
        self.port = _free_port()
        self.token = secrets.token_hex(16)  # its API key: only this front talks to it
        context = [CONTEXT_FLAGS[kind], str(max_model_len)] if max_model_len and kind in CONTEXT_FLAGS else []
        self.command = [*shlex.split((command or template).format(
            model=shlex.quote(model), port=self.port, token=self.token)), *context, *args]
        self.url = f"http://127.0.0.1:{self.port}{api_path or default_path}"
        self.start_timeout_s = start_timeout_s
        self.state = "stopped"  # stopped | starting | ready | restarting | failed
        self.restarts = 0
        self.error: str | None = None
        _sweep_stale_folders()
        self._log_dir = tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX)
        (Path(self._log_dir.name) / OWNER_FILE).write_text(str(os.getpid()))  # whose it is: swept once it died
        self.log_path = Path(self._log_dir.name) / "server.log"
        self._proc: subprocess.Popen | None = None
        self._watch: asyncio.Task | None = None
        self._health = f"http://127.0.0.1:{self.port}{HEALTH[kind]}" if kind in HEALTH else None
        self._serving = asyncio.Event()  # set while it answers: requests wait on it during a restart

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the child and wait until it answers; raises ``RuntimeError`` saying why not
        (not installed, exited, or not up within ``start_timeout_s``, with its last log lines)."""
        if self.kind == "llama.cpp":
            self._check_gguf()
        if not self.command or shutil.which(self.command[0]) is None:
            self._fail(f"{self.command[0] if self.command else 'no command'} was not found on PATH: "
                       f"{INSTALL.get(self.kind, 'set InferApp.serve_command to the command that starts it')}.")
        self.state = "starting"
        self._spawn()
        await self._until_up()
        self.state = "ready"
        self._serving.set()
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name="jupyter-infer-child")

    async def stop(self) -> None:
        """End the child (its whole process group): SIGTERM, then SIGKILL after 5 s."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        proc, self._proc = self._proc, None
        self._serving.clear()
        await _end(proc)
        self.state = "stopped"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def serving(self) -> bool:
        """Up and answering: ready, and its process alive (a child killed a moment ago is not,
        before the supervisor has seen it)."""
        return self.state == "ready" and self._proc is not None and self._proc.poll() is None

    async def wait_serving(self, timeout: float) -> None:
        """Until it serves (now, or after the restart under way); raises ``EngineUnavailable``
        saying why if it failed, or is not back within ``timeout`` seconds."""
        if self.serving:
            return
        if self.state == "ready":  # just died: the supervisor restarts it within WATCH_EVERY_S
            self._serving.clear()
        if self.state in ("failed", "stopped"):
            raise EngineUnavailable(f"The {self.kind} server this one runs is {self.state}: {self.error or 'stopped'}")
        try:
            await asyncio.wait_for(self._serving.wait(), timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"The {self.kind} server this one runs did not serve again within {timeout:g} s "
                                    f"({self.error or self.state}); its log: {self.log_path}.") from None

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
                    healthy = self._health is None or (await client.get(self._health)).status_code == 200
                    if healthy and (await client.get(f"{self.url}/models")).status_code == 200:
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
            await asyncio.sleep(WATCH_EVERY_S)
            if self._proc is None or self._proc.poll() is None:
                continue
            self._serving.clear()
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
            self._serving.set()
            log_line.info("jupyter_infer | %s is back (restart %d)", self.kind, self.restarts)

    def _check_gguf(self) -> None:
        """llama-server reads GGUF files only: a checkpoint folder or a missing path is said so
        here, not in llama-server's "failed to read magic" after a start."""
        path = Path(self.model).expanduser()
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            self._fail(f"llama.cpp serves a .gguf file, and {self.model} is a folder: "
                       + (f"name its GGUF file ({ggufs[0]})" if ggufs else
                          "convert the checkpoint with llama.cpp's convert_hf_to_gguf.py, or serve the folder "
                          "with --engine hf") + ".")
        if not path.is_file():
            self._fail(f"llama.cpp serves a .gguf file, and there is none at {self.model}: check the path "
                       "(InferApp.model), or name a file InferApp.model_dirs lists.")

    def _fail(self, why: str) -> None:
        tail = self.log_tail(8)
        self.state = "failed"
        self.error = why + (": ..." + " | ".join(tail) if tail else "") + \
            (f" (its log: {self.log_path})" if self.log_path.is_file() else "")
        log_line.error("jupyter_infer | the %s server did not start: %s", self.kind, self.error)
        raise RuntimeError(self.error)


def _sweep_stale_folders() -> None:
    """Remove the log folders of children whose Jupyter server died (SIGKILL leaves them)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue  # another user's: their server sweeps it
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (no owner written): left alone
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


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

