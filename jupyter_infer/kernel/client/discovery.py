"""Where a ``Client`` sends its requests, in this order:

1. ``Client(url=..., token=...)``, explicitly;
2. the environment: ``JUPYTER_INFER_URL`` and ``JUPYTER_INFER_TOKEN`` (on JupyterHub, where
   the admin points users at a shared service, the token defaults to the user's own hub token,
   ``JUPYTERHUB_API_TOKEN``: docs/deployment.md);
3. the Jupyter server that runs this kernel: among the running servers (the ``jpserver-*.json``
   files of Jupyter's runtime directory), the one whose process is this kernel's parent
   (``JPY_PARENT_PID``), or else the one whose ``api/kernels`` lists this kernel's id (from
   its connection file);
4. otherwise an engine inside this process (*embedded* mode), with a note saying so.

The answer is kept for the process (a kernel's server does not change), so only the first
client pays for it; candidates are probed in parallel with short timeouts. Reading the
runtime directory directly, rather than through ``jupyter_server.serverapp``, saves that
module's import (over a second) in every new kernel.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...values.config import normalize_url

ENV_URL = "JUPYTER_INFER_URL"
ENV_TOKEN = "JUPYTER_INFER_TOKEN"
HUB_TOKEN = "JUPYTERHUB_API_TOKEN"  # in a hub user's server and its kernels: the user's token
PROBE_TIMEOUT_S = 2.0  # loopback servers answer in milliseconds; a dead one must not cost more
_SERVER_FILE = re.compile(r"jpserver-.+\.json")


@dataclass
class Connection:
    """Where a client sends its requests, and how that was decided."""

    backend: str  # "server" | "embedded" | "openai" (a plain OpenAI-compatible server)
    source: str  # "explicit" | "environment" | "kernel's server" | "embedded"
    url: str | None = None
    token: str | None = None
    note: str | None = None

    def __str__(self) -> str:
        if self.backend == "server":
            return f"server {self.url} (found via {self.source})"
        if self.backend == "openai":
            return f"OpenAI-compatible server {self.url} (client-side timings)"
        return "embedded engine in this process"


def _get_json(url: str, token: str | None, timeout: float = PROBE_TIMEOUT_S) -> Any:
    headers = {"Authorization": f"token {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
        return json.loads(resp.read())


def probe(url: str, token: str | None) -> str | None:
    """``None`` if ``infer/status`` answers at ``url``; otherwise why not."""
    try:
        _get_json(url + "infer/status", token)
        return None
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return f"{url} has no infer/ routes (is the jupyter_infer server extension enabled?)"
        if err.code in (401, 403):
            return f"{url} refused the token ({err.code})"
        return f"{url} answered {err.code}"
    except (OSError, ValueError) as err:
        return f"{url} did not answer ({err})"


def _kernel_id() -> str | None:
    """This kernel's id, from its connection file name (``kernel-<id>.json``)."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:
        return None
    if name.startswith("kernel-") and name.endswith(".json"):
        return name[len("kernel-") : -len(".json")]
    return None


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    if os.name == "nt":
        return True  # no cheap check; a dead server fails its probe instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """The running Jupyter servers' info (what ``list_running_servers`` yields), read from the
    runtime directory without importing ``jupyter_server``; files of dead servers are skipped."""
    try:
        if runtime_dir is None:
            from jupyter_core.paths import jupyter_runtime_dir

            runtime_dir = jupyter_runtime_dir()
        names = os.listdir(runtime_dir)
    except Exception:
        return []
    servers = []
    for name in names:
        if not _SERVER_FILE.fullmatch(name):
            continue
        try:
            with open(os.path.join(runtime_dir, name), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue  # being written, or gone
        if isinstance(info, dict) and _alive(info.get("pid")):
            servers.append(info)
    return servers


def _lists_kernel(info: dict[str, Any], kernel_id: str) -> bool:
    try:
        kernels = _get_json(normalize_url(info.get("url", "")) + "api/kernels", info.get("token"))
    except (OSError, ValueError):
        return False
    return isinstance(kernels, list) and any(isinstance(k, dict) and k.get("id") == kernel_id for k in kernels)


def find_kernel_server(
    servers: Iterable[dict[str, Any]] | None = None,
    *,
    parent_pid: int | None = None,
    kernel_id: str | None = None,
) -> dict[str, Any] | None:
    """The running Jupyter server that started this kernel, or ``None``.

    First the server whose pid is the kernel's parent (jupyter_client sets ``JPY_PARENT_PID``);
    then, for kernels behind a provisioner or a wrapper, the server whose ``api/kernels`` lists
    this kernel's id (all servers asked at once). Any other server is not this kernel's, and is
    never picked.
    """
    servers = running_servers() if servers is None else list(servers)
    if not servers:
        return None
    if parent_pid is None:
        try:
            parent_pid = int(os.environ.get("JPY_PARENT_PID") or os.getppid())
        except ValueError:
            parent_pid = os.getppid()
    for info in servers:
        if info.get("pid") in (parent_pid, os.getppid()):
            return info
    kernel_id = kernel_id or _kernel_id()
    if kernel_id is None:
        return None
    with ThreadPoolExecutor(max_workers=min(len(servers), 8), thread_name_prefix="jupyter-infer-probe") as pool:
        listed = list(pool.map(lambda info: _lists_kernel(info, kernel_id), servers))
    return next((info for info, yes in zip(servers, listed, strict=True) if yes), None)


_cache: dict[tuple[Any, ...], Connection] = {}
_cache_lock = threading.Lock()


def discover(url: str | None = None, token: str | None = None, *, refresh: bool = False) -> Connection:
    """Decide where requests go (see the module docstring); probes ``infer/status``.

    The answer is cached for the process (per environment and token); ``refresh=True``
    looks again, e.g. after starting a server.
    """
    if url:
        return Connection("server", "explicit", normalize_url(url), token or os.environ.get(ENV_TOKEN))
    key = (token, os.environ.get(ENV_URL), os.environ.get(ENV_TOKEN), os.environ.get(HUB_TOKEN),
           os.environ.get("JPY_PARENT_PID"))
    with _cache_lock:  # one search at a time: a second client waits for the first's answer
        if refresh or key not in _cache:
            _cache[key] = _search(token)
        return _cache[key]


def clear_cache() -> None:
    """Forget what ``discover`` found (the next call looks again)."""
    with _cache_lock:
        _cache.clear()


def _search(token: str | None) -> Connection:
    notes: list[str] = []
    env_url = os.environ.get(ENV_URL)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="jupyter-infer-probe") as pool:
        # The environment's server and this kernel's server are looked for at the same time.
        env_conn = None
        if env_url:
            env_token = token or os.environ.get(ENV_TOKEN) or os.environ.get(HUB_TOKEN)
            env_conn = Connection("server", "environment", normalize_url(env_url), env_token)
            env_why = pool.submit(probe, env_conn.url, env_conn.token)
        kernel_conn = pool.submit(_kernel_connection, token)
        if env_conn is not None:
            why = env_why.result()
            if why is None:
                return env_conn
            notes.append(f"{ENV_URL}: {why}")
        conn, why = kernel_conn.result()
    if conn is not None and why is None:
        return conn
    notes.append(f"this kernel's server: {why}" if conn is not None else why)
    note = (
        "jupyter_infer: no inference server found ("
        + "; ".join(notes)
        + "); running an embedded engine inside this process instead. Set JUPYTER_INFER_URL "
        "and JUPYTER_INFER_TOKEN, or pass Client(url=..., token=...), to use a server."
    )
    return Connection("embedded", "embedded", note=note)


def _kernel_connection(token: str | None) -> tuple[Connection | None, str | None]:
    """This kernel's server and ``None``, or the server and why it does not serve, or
    ``None`` and why there is none."""
    info = find_kernel_server()
    if info is None:
        return None, "no Jupyter server runs this kernel"
    conn = Connection("server", "kernel's server", normalize_url(info["url"]), token or info.get("token"))
    return conn, probe(conn.url, conn.token)
