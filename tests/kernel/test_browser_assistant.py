"""A notebook assistant from PyPI, configured to this server, in JupyterLab in a real browser.

Notebook Intelligence 6.2 (``notebook-intelligence`` on PyPI, installed beside us by
tests/tool_venvs.py) with its Ollama provider: the ``ollama`` client it uses reads
``OLLAMA_HOST`` (a base URL with a path: ``<server>/infer``) and ``OLLAMA_API_KEY`` (sent as
``Authorization: Bearer``, which Jupyter takes as its token), so two environment variables point
it at our Ollama API, with no change to its code. It lists the models from ``api/tags``, reads
each one's context from ``api/show`` and chats on ``api/chat``.

Our server runs as ``jupyter infer serve`` in a process of its own, beside the lab: Notebook
Intelligence lists Ollama's models with a blocking HTTP call on the Jupyter server's event loop
(its capabilities and refresh handlers), so against the Ollama API of the *same* Jupyter server
it waits on itself until its 5 s timeout and lists nothing. The chat itself runs on a thread and
would work; the listing cannot.

The test picks the Ollama provider in the assistant's settings as a person would, checks that
its model list is what our ``api/tags`` lists, sends a question from the chat sidebar, and sees
our simulated engine's answer there; our server's metrics and access log saw the request.
Screenshots go to the test's tmp dir and to ``/tmp/assistant-shots/``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tool_venvs
from server_helpers import stop_process

from jupyter_infer.cpu.child_process import dies_with_parent
from jupyter_infer.kernel.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
SHOTS = Path("/tmp/assistant-shots")
TOKEN = "assistant-test-token-0123456789"  # the lab's and our server's (the Ollama client sends it)
SIDEBAR = "#notebook-intelligence-tab"

if not CHROMIUM.exists():
    pytest.skip(f"Debian's Chromium is not at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the test extra: pip install -e '.[test]'")
expect = sync_api.expect


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}/{path}", headers={"Authorization": f"token {TOKEN}"}, timeout=30)
        response.raise_for_status()
        return response.json()


def _wait_ready(server: Server, path: str, what: str, timeout: float = 120) -> None:
    """Until ``path`` answers (``infer/status``: ready), or fail with the server's log."""
    deadline = time.monotonic() + timeout
    while True:
        assert server.proc.poll() is None, f"{what} exited:\n{server.log.read_text()[-3000:]}"
        try:
            if server.get(path).get("state", "ready") == "ready":
                return
        except (httpx.HTTPError, ValueError):
            pass
        assert time.monotonic() < deadline, f"{what} not ready after {timeout:.0f} s:\n{server.log.read_text()[-3000:]}"
        time.sleep(0.3)


def _start(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=dies_with_parent())


@pytest.fixture(scope="module")
def nbi_python() -> Path:
    try:
        return tool_venvs.ensure("notebook-intelligence")
    except (subprocess.CalledProcessError, OSError) as error:  # offline, no PyPI: nothing to test with
        pytest.skip(f"Notebook Intelligence could not be installed in .venv-tools ({error}): `make tools`")


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Server]:
    """``jupyter infer serve`` on the simulated engine; its model folder holds the tiny model,
    so that api/tags lists two models (no Hugging Face cache, no Ollama store of this machine)."""
    home = tmp_path_factory.mktemp("infer-serve")
    (home / "models").mkdir()
    (home / "models" / "tiny").symlink_to(tiny_model_dir, target_is_directory=True)
    port = free_port()
    env = {**tool_venvs._clean_env(), "HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1",
           "OLLAMA_MODELS": str(home / "ollama"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    proc = _start([sys.executable, "-m", "jupyter_infer.commands.cli", "serve", "--engine=simulated",
                   "--InferApp.simulated_token_delay_ms=2", "--InferApp.simulated_token_delay_ms=2",
                   f"--InferApp.model_dirs={home / 'models'}", f"--port={port}", "--ip=127.0.0.1",
                   f"--IdentityProvider.token={TOKEN}"], home, env, home / "serve.log")
    server = Server(f"http://127.0.0.1:{port}", proc, home / "serve.log")
    try:
        _wait_ready(server, "infer/status", "jupyter infer serve")
        yield server
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, nbi_python: Path, ours: Server) -> Iterator[Server]:
    """JupyterLab from the environment Notebook Intelligence is installed in, its Ollama
    provider pointed at our server by the two variables the ``ollama`` client reads."""
    home = tmp_path_factory.mktemp("assistant-lab")  # HOME too: its settings live in ~/.jupyter/nbi
    (home / "work").mkdir()
    news = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no toast over the chat
    port = free_port()
    env = {**tool_venvs._clean_env(), "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "OLLAMA_HOST": f"{ours.url}/infer", "OLLAMA_API_KEY": TOKEN,
           "NBI_TOUR_DISABLED": "1"}  # its first-run tour would cover the sidebar
    for name in ("JUPYTER_CONFIG_PATH", "JUPYTER_PATH"):  # the lab's own environment's config only
        env.pop(name, None)
    proc = _start([str(nbi_python), "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
                   f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}"],
                  home / "work", env, home / "lab.log")
    server = Server(f"http://127.0.0.1:{port}", proc, home / "lab.log")
    try:
        _wait_ready(server, "notebook-intelligence/capabilities", "jupyter lab with Notebook Intelligence")
        yield server
    finally:
        stop_process(proc)


def _open(tab: Any, inside: Any) -> None:
    """Click the sidebar's tab until what is inside shows (the lab may restore its layout, the
    sidebar with it, after the tab is there: a click then would close it again)."""
    for attempt in range(3):
        if inside.is_visible():
            return
        tab.click()
        try:
            expect(inside).to_be_visible(timeout=15_000)
            return
        except AssertionError:
            if attempt == 2:
                raise


def _chosen(config: Path) -> tuple[tuple[str, str], str] | None:
    """The chat model and the auto-complete provider Notebook Intelligence saved."""
    if not config.exists():
        return None
    saved = json.loads(config.read_text())
    chat, inline = saved.get("chat_model", {}), saved.get("inline_completion_model", {})
    return (chat.get("provider"), chat.get("model")), inline.get("provider")


def _shot(target: Any, folder: Path, name: str) -> None:
    target.screenshot(path=str(folder / name))
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / name, SHOTS / name)


def test_notebook_intelligence_lists_our_models_and_chats_through_our_server(
        lab: Server, ours: Server, tmp_path: Path) -> None:
    tags = [m["name"] for m in ours.get("infer/api/tags")["models"]]
    assert "simulated" in tags and "tiny" in tags, tags  # listed by its name under ~/models, not its path
    before = ours.get("infer/metrics")["requests"]["ok"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.set_default_timeout(30_000)
        page.goto(f"{lab.url}/lab?token={TOKEN}")
        tab = page.locator('.lm-TabBar-tab[data-id="notebook-intelligence-tab"]')
        expect(tab).to_be_visible(timeout=60_000)
        expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
        sidebar = page.locator(SIDEBAR)
        _open(tab, sidebar.locator(".sidebar-header"))
        expect(sidebar).to_contain_text("not logged in to GitHub Copilot")  # its default provider
        _shot(page, tmp_path, "nbi-lab-before-configuring.png")

        # Its settings: the chat model's provider, then the model from the list it got from us.
        sidebar.locator('button[data-tour-id="settings-gear"]').click()
        settings = page.locator("#nbi-settings")
        rows = settings.locator(".model-config-section-row").filter(has=page.locator("select option[value=ollama]"))
        provider, model = rows.nth(0).locator("select").nth(0), rows.nth(0).locator("select").nth(1)  # chat
        provider.select_option("ollama")
        expect(model.locator("option")).to_have_count(len(tags))
        listed = model.locator("option").evaluate_all("options => options.map(o => o.value)")
        assert sorted(listed) == sorted(tags), (listed, tags)
        model.select_option("simulated")
        rows.nth(1).locator("select").first.select_option("none")  # auto-complete: not GitHub Copilot either
        config = Path(lab.log.parent, ".jupyter", "nbi", "config.json")  # where it keeps the choice
        deadline = time.monotonic() + 20
        while _chosen(config) != (("ollama", "simulated"), "none"):
            assert time.monotonic() < deadline, config.read_text() if config.exists() else "no config.json"
            time.sleep(0.2)
        settings.get_by_role("button", name=re.compile("Re-check")).click()  # its own checks, run again
        expect(settings).to_contain_text("ollama, model 'simulated'")
        expect(settings).to_contain_text(f"{len(tags)} model(s) available.")
        _shot(settings, tmp_path, "nbi-settings-ollama-provider.png")

        # The sidebar says "not logged in to GitHub Copilot" until the lab is loaded again.
        page.get_by_role("tab", name="NBI Settings").locator(".lm-TabBar-tabCloseIcon").click()
        page.reload()
        expect(tab).to_be_visible(timeout=60_000)
        _open(tab, sidebar.locator(".sidebar-greeting"))

        # A question from the chat sidebar: our simulated engine's answer, streamed into it.
        sidebar.locator("#sidebar-user-input textarea").fill("What is the KV cache?")
        sidebar.locator(".send-button").click()
        answer = sidebar.locator(".chat-message-copilot .chat-message-content")
        expect(answer).to_contain_text(re.compile("KV cache"), timeout=60_000)
        expect(sidebar.locator(".chat-message-from-progress").last).to_be_hidden(timeout=60_000)  # done streaming
        text = answer.inner_text()
        assert len(text.split()) >= 40, text  # the simulated engine's whole answer, not an error line
        _shot(sidebar, tmp_path, "nbi-chat-answer.png")
        _shot(page, tmp_path, "nbi-lab-chat-full.png")
        browser.close()
    assert not errors, errors
    assert ours.get("infer/metrics")["requests"]["ok"] == before + 1
    seen = [line for line in ours.log.read_text().splitlines() if "POST /infer/api/chat 200" in line]
    assert len(seen) == 1, seen
    assert "Failed to update supported Ollama models" not in lab.log.read_text()
