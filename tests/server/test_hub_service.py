"""``jupyter infer serve`` as a JupyterHub service, behind a real hub and its proxy.

One hub for the module (``jupyterhub`` from PyPI, configurable-http-proxy from npm through
tests/tool_venvs.py), no user servers: the hub starts the managed service ``infer``, whose
command is ``jupyter infer serve``, and the proxy routes ``/services/infer/`` to it. Users
alice and bob hold a role with ``access:services!service=infer``; carol has none. Their
tokens come from the hub's REST API, made by a test-only service that may manage tokens.
Every test asserts what a user sees through the proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import tool_venvs

from jupyter_infer.cpu.child_process import dies_with_parent
from jupyter_infer.kernel.launcher import free_port

pytestmark = pytest.mark.timeout(120)

SERVICE = "infer"
USERS_WITH_ACCESS = ("alice", "bob")
STARTUP_TIMEOUT_S = 60.0

HUB_CONFIG = """
c = get_config()  # noqa: F821
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{root}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{root}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{root}/jupyterhub.pid"
c.JupyterHub.authenticator_class = "null"  # API tokens only; no one logs in with a password
c.Authenticator.allowed_users = {{"alice", "bob", "carol", "teacher"}}
c.Authenticator.admin_users = {{"teacher"}}  # a hub admin: reaches every service, sees all requests
c.JupyterHub.services = [
    {{
        "name": "{service}",
        "url": "http://127.0.0.1:{service_port}",
        "command": {command!r},
        "cwd": "{root}",
        "environment": {environment!r},
    }},
    {{"name": "test-admin", "api_token": "{admin_token}"}},
]
c.JupyterHub.load_roles = [
    {{"name": "infer-users", "users": {users!r}, "scopes": ["access:services!service={service}"]}},
    {{"name": "test-admin", "services": ["test-admin"], "scopes": ["admin:users", "tokens"]}},
]
"""


@dataclass
class Hub:
    """A JupyterHub with the ``infer`` service, in its own directory, on free ports."""

    root: Path
    proxy: Path
    port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    tokens: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        """Where users reach the inference server: through the hub's proxy."""
        return f"{self.url}/services/{SERVICE}/infer"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "jupyter_infer.commands.cli", "serve", "--InferApp.engine=simulated",
            # 5 ms a token: short answers are quick, a long one runs long enough to cancel.
            "--InferApp.simulated_token_delay_ms=5", "--InferApp.simulated_token_delay_ms=5",
            "--InferApp.simulated_prefill_ms_per_token=0",
        ]
        # Jupyter's own dirs in the test's directory: no user config, and the server's runtime
        # file (jpserver-<pid>.json) says where to find it if the hub leaves it behind.
        environment = {"JUPYTER_CONFIG_DIR": str(self.root / "config"),
                       "JUPYTER_RUNTIME_DIR": str(self.runtime_dir),
                       "JUPYTER_DATA_DIR": str(self.root / "data")}
        config = HUB_CONFIG.format(
            port=self.port, hub_port=free_port(), proxy_api_port=free_port(), proxy=str(self.proxy),
            root=self.root, service=SERVICE, service_port=free_port(), command=command,
            environment=environment, admin_token=self.admin_token, users=list(USERS_WITH_ACCESS),
        )
        (self.root / "jupyterhub_config.py").write_text(config)
        self._log = open(self.root / "hub.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", "jupyterhub_config.py"],
            cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=dies_with_parent(),
        )
        self._wait(lambda: httpx.get(f"{self.url}/hub/api/").status_code == 200, "the hub's API")
        for user in ("alice", "bob", "carol", "teacher"):
            self.tokens[user] = self.make_token(user)
        self._wait(lambda: self.get("health", self.tokens["alice"]).status_code == 200,
                   f"{self.service_url}/health")

    def make_token(self, user: str) -> str:
        reply = httpx.post(f"{self.url}/hub/api/users/{user}/tokens", json={"note": "test", "expires_in": 3600},
                           headers={"Authorization": f"token {self.admin_token}"})
        assert reply.status_code == 201, reply.text
        return reply.json()["token"]

    def get(self, path: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.service_url}/{path}", headers=_auth(token), timeout=10, **kwargs)

    def post(self, path: str, body: dict[str, Any], token: str | None = None) -> httpx.Response:
        return httpx.post(f"{self.service_url}/{path}", json=body, headers=_auth(token), timeout=30)

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited early:\n{self.log_tail()}")
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{what} did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the hub, which stops its proxy and the service; then anything it left behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        for info in self.runtime_dir.glob("jpserver-*.json"):  # the service, if still running
            _kill(json.loads(info.read_text()).get("pid"), "jupyter_infer.commands.cli")
        pid_file = self.root / "jupyterhub-proxy.pid"  # the proxy, if the hub left it running
        if pid_file.exists():
            _kill(int(pid_file.read_text().strip() or 0), "configurable-http-proxy")
        if getattr(self, "_log", None):
            self._log.close()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join((self.root / "hub.log").read_text().splitlines()[-lines:])


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"token {token}"} if token else {}


def _kill(pid: int | None, command: str) -> None:
    """Kill ``pid`` if it still runs ``command`` (and is not a process that took its pid over)."""
    try:
        if pid and command.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        pass


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for JupyterHub's proxy (configurable-http-proxy from npm)")
    hub = Hub(tmp_path_factory.mktemp("hub"), proxy=tool_venvs.ensure("configurable-http-proxy"))
    try:
        hub.start()
        yield hub
    finally:
        hub.stop()


def generate(hub: Hub, user: str) -> httpx.Response:
    return hub.post("generate", {"prompt": "hi", "max_tokens": 8}, hub.tokens[user])


# -- a user with the role --------------------------------------------------------------------
def test_a_user_with_the_role_generates_with_her_hub_token(hub: Hub) -> None:
    reply = generate(hub, "alice")
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["text"] and answer["usage"]["completion_tokens"] == 8
    assert reply.headers["X-Request-Id"] == answer["id"]
    status = hub.get("status", hub.tokens["alice"])
    assert status.status_code == 200 and status.json()["engine"] == "simulated"
    # The service's page in the hub's menu (/services/infer/) lands on the status.
    landing = httpx.get(f"{hub.url}/services/{SERVICE}/", headers=_auth(hub.tokens["alice"]), follow_redirects=True)
    assert landing.status_code == 200 and landing.url.path == f"/services/{SERVICE}/infer/status"


def test_a_browser_without_a_session_is_sent_to_the_hubs_oauth(hub: Hub) -> None:
    page = httpx.get(f"{hub.url}/services/{SERVICE}/infer/")
    assert page.status_code == 302 and "/hub/api/oauth2/authorize" in page.headers["Location"]
    assert f"client_id=service-{SERVICE}" in page.headers["Location"]


def test_the_openai_sdk_works_with_the_hub_token_as_api_key(hub: Hub) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{hub.service_url}/v1", api_key=hub.tokens["bob"], max_retries=0)
    chat = client.chat.completions.create(
        model="simulated", messages=[{"role": "user", "content": "What is attention?"}], max_tokens=8,
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
    assert [m.id for m in client.models.list()]


# -- everyone else is refused ------------------------------------------------------------------
def test_a_user_without_the_role_is_refused(hub: Hub) -> None:
    assert generate(hub, "carol").status_code == 403
    assert hub.get("status", hub.tokens["carol"]).status_code == 403
    assert hub.get("health", hub.tokens["carol"]).status_code == 403


def test_no_token_or_a_bogus_one_is_refused(hub: Hub) -> None:
    for token in (None, "not-a-hub-token", hub.admin_token):  # the admin service has no access scope
        reply = hub.post("generate", {"prompt": "hi", "max_tokens": 8}, token)
        assert reply.status_code in (401, 403), (token, reply.status_code, reply.text)
        assert "text" not in reply.text
        assert hub.get("status", token).status_code in (401, 403)
    # A browser is sent to the hub to log in, never answered with a generation.
    reply = hub.get("generate_stream", params={"prompt": "hi"}, follow_redirects=False)
    assert reply.status_code in (302, 401, 403)
    assert reply.status_code != 302 or "/hub/" in reply.headers["Location"]


# -- each user's requests are her own (they pass once requests carry their owner) -----------
def test_a_users_batches_show_her_request_and_hide_it_from_others(hub: Hub) -> None:
    reply = generate(hub, "alice")
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["id"]

    def ids(view: dict[str, Any]) -> set[str]:
        members = {m for batch in view["batches"] for m in batch["members"]}
        return members | {r["id"] for r in view.get("requests", [])}

    alice = hub.get("batches", hub.tokens["alice"])
    assert alice.status_code == 200 and request_id in ids(alice.json())
    bob = hub.get("batches", hub.tokens["bob"])
    assert bob.status_code == 200 and bob.json()["batches"]
    assert request_id not in ids(bob.json()) and request_id not in bob.text


def test_cancelling_another_users_request_is_not_found(hub: Hub) -> None:
    body = {"prompt": "hi", "max_tokens": 400}  # about 2 s of tokens: running while we cancel
    with httpx.stream("POST", f"{hub.service_url}/generate_stream", json=body,
                      headers=_auth(hub.tokens["alice"]), timeout=30) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        request_id = next(line for line in lines if line.startswith("id:"))[3:].strip()
        cancel = httpx.delete(f"{hub.service_url}/requests/{request_id}", headers=_auth(hub.tokens["bob"]))
        assert cancel.status_code == 404, cancel.text
        mine = httpx.delete(f"{hub.service_url}/requests/{request_id}", headers=_auth(hub.tokens["alice"]))
        assert mine.status_code == 200, mine.text  # it was running: only bob may not cancel it
        for _ in lines:
            pass


def test_a_hub_admin_sees_every_users_requests_by_name(hub: Hub) -> None:
    reply = generate(hub, "alice")
    request_id = reply.json()["id"]
    teacher = hub.get("batches", hub.tokens["teacher"]).json()
    mine = next(r for r in teacher["requests"] if r["id"] == request_id)
    assert mine["owner"] == "alice" and "anonymous" not in mine  # the owner is the hub user
    owners = hub.get("metrics", hub.tokens["teacher"]).json()["owners"]
    assert owners["alice"]["ok"] >= 1
    assert set(hub.get("metrics", hub.tokens["bob"]).json()["owners"]) <= {"bob"}
