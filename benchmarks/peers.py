"""Other inference servers over HTTP, next to ours, each a ``CompletionsPeer`` on the same
model folder, prompts and client (``jupyter_infer.commands.bench.completions``).

- ``transformers serve --continuous-batching`` (transformers' ``[serving]`` extra): its
  OpenAI server over the same continuous-batching manager the in-process tables measure.
- ``llama-server -np 16 -cb`` (llama.cpp), on a GGUF conversion of the same model, when a
  binary is on ``PATH`` and a GGUF is given (``docs/benchmark.md`` says how to get both).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from jupyter_infer.commands.bench.completions import CompletionsPeer
from jupyter_infer.cpu.child_process import dies_with_parent


class ServerProcess:
    """A server started as a subprocess, ready once ``ready_url`` answers 200."""

    def __init__(self, cmd: list[str], ready_url: str, log_path: Path, env: dict[str, str] | None = None,
                 timeout: float = 300.0, headers: dict[str, str] | None = None) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     preexec_fn=dies_with_parent())  # a killed bench leaves no server behind
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{Path(cmd[0]).name} exited early: see {log_path}")
            try:
                with urllib.request.urlopen(urllib.request.Request(ready_url, headers=headers or {}), timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{Path(cmd[0]).name} did not answer within {timeout:.0f} s: see {log_path}")
            time.sleep(0.25)
        self.startup_s = time.perf_counter() - started

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def memory_mb(self) -> dict[str, float]:
        """Peak (VmHWM) and resident (VmRSS) memory of the process so far, in MiB (Linux)."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return {"peak_mb": int(fields["VmHWM"].split()[0]) / 1024, "resident_mb": int(fields["VmRSS"].split()[0]) / 1024}

    def cpu_seconds(self) -> float | None:
        """CPU time the process used so far (Linux), to see what it costs while idle."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def transformers_serve(model_dir: str, device: str, dtype: str, threads: int, max_batch_size: int,
                       max_tokens_per_request: int, log_path: Path, page_size: int = 32) -> CompletionsPeer:
    """``transformers serve --continuous-batching`` on ``model_dir``, its paged cache sized like
    the in-process manager's (its default takes most of free memory)."""
    from jupyter_infer.kernel.launcher import free_port

    exe = shutil.which("transformers", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        raise RuntimeError("the `transformers` command is not installed (pip install 'transformers[serving]')")
    port = free_port()
    blocks = max_batch_size * math.ceil(max_tokens_per_request / page_size) + 8
    cmd = [exe, "serve", model_dir, "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
           "--device", device, "--dtype", dtype, "--cb-block-size", str(page_size), "--cb-num-blocks", str(blocks),
           "--cb-max-batch-tokens", "1024", "--log-level", "warning"]
    process = ServerProcess(cmd, f"http://127.0.0.1:{port}/v1/models", log_path,
                            env={"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"})
    return CompletionsPeer("hf_serve", "transformers serve --continuous-batching",
                           f"http://127.0.0.1:{port}/v1/", model_dir, process=process)


def llama_server(gguf: str, threads: int, parallel: int, context_per_slot: int, log_path: Path, *,
                 exe: str | None = None, name: str = "llama_server",
                 label: str = "llama.cpp llama-server -cb", extra: dict[str, Any] | None = None,
                 args: list[str] | None = None) -> CompletionsPeer:
    """llama.cpp's ``llama-server -np N -cb`` on a GGUF of the same model (``exe``: its path;
    default: ``llama-server`` on PATH)."""
    from jupyter_infer.kernel.launcher import free_port

    exe = exe or shutil.which("llama-server")
    if exe is None or not Path(exe).is_file():
        raise RuntimeError(f"no llama-server {'at ' + exe if exe else 'on PATH'} "
                           "(docs/benchmark.md: how to build one and convert the model)")
    if not Path(gguf).is_file():
        raise RuntimeError(f"no GGUF at {gguf} (docs/benchmark.md: convert the model with convert_hf_to_gguf.py)")
    port = free_port()
    cmd = [exe, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-np", str(parallel), "-cb",
           "-t", str(threads), "-c", str(parallel * context_per_slot), *(args or [])]
    process = ServerProcess(cmd, f"http://127.0.0.1:{port}/health", log_path)
    # cache_prompt off: the rounds repeat the same prompts, and llama-server would otherwise
    # reuse each slot's KV from the previous round (ours runs with its prefix cache off too).
    return CompletionsPeer(name, label, f"http://127.0.0.1:{port}/v1/", gguf,
                           extra={"stream_options": {"include_usage": True}, "cache_prompt": False, **(extra or {})},
                           process=process)
