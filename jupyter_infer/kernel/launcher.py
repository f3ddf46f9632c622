"""Start a real Jupyter server with the extension on a free loopback port, for the demo,
the benchmark and tests that drive the server over HTTP like any client would."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..cpu.child_process import dies_with_parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``with LocalServer(engine="simulated") as server: server.url, server.token``.

    Keyword arguments become ``--InferApp.<name>=<value>`` options. ``alone``: ``jupyter infer
    serve``, the server that loads our extension and nothing else (the one to set beside
    another inference server); otherwise a Jupyter server with every extension installed
    packages enable (JupyterLab's among them), as inside a user's ``jupyter lab``.
    """

    def __init__(self, *, startup_timeout: float = 120.0, log_path: str | None = None, alone: bool = False,
                 **infer_options: Any) -> None:
        self.alone = alone
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.options = infer_options
        self.startup_timeout = startup_timeout
        self._root = tempfile.TemporaryDirectory(prefix="jupyter-infer-server-")
        self._log_path = Path(log_path) if log_path else Path(self._root.name) / "server.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._root.cleanup()

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", *(("jupyter_infer.commands.cli", "serve") if self.alone else ("jupyter_server",)),
            "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self._root.name}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        cmd += [arg for k, v in self.options.items() for arg in _cli_options(k, v)]
        self._log = open(self._log_path, "w")  # noqa: SIM115 - closed in stop()
        # Ends with its parent (a test's timeout, a killed bench): no server left with parent 1.
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=dies_with_parent())
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited early:\n{self.log_tail()}")
            try:
                self.get("api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"jupyter server did not answer within {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if getattr(self, "_log", None):
            self._log.close()

    @property
    def pid(self) -> int | None:
        """The server process's id (None when it is not running)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def get(self, path: str, timeout: float = 10.0) -> Any:
        req = urllib.request.Request(self.url + path, headers=self.headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: dict, timeout: float = 120.0) -> Any:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST",
            headers={**self.headers, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self._log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""


def _cli_options(name: str, value: Any) -> list[str]:
    """``--InferApp.name=value``; a list trait takes one option per item."""
    if isinstance(value, (list, tuple)):
        return [f"--InferApp.{name}={item}" for item in value]
    return [f"--InferApp.{name}={value}"]
