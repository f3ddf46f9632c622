"""Jupyter AI beside us: Jupyternaut, Jupyter AI 3's agent, answers and calls its tools through
our server, set up as docs/notebooks.md says (its model ``openai/<our model>``, ``api_base``
our ``infer/v1``, the Jupyter token as its key). One Jupyter server from the environment where
Jupyter AI is installed beside us (tests/tool_venvs.py), on the simulated engine, driven through
the chat's WebSocket as the lab's chat panel drives it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tool_venvs
from server_helpers import stop_process
from tornado.websocket import websocket_connect

from jupyter_infer.cpu.child_process import dies_with_parent
from jupyter_infer.kernel.launcher import free_port

pytestmark = pytest.mark.timeout(300)
TOKEN = "jupyter-ai-test-token"
NAUT = "jupyter-ai-personas::jupyter_ai_jupyternaut::JupyternautPersona"


@dataclass
class Lab:
    root: Path
    port: int
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}/{path}", headers={"Authorization": f"token {TOKEN}"}, timeout=30)


def jupyternaut_options(url: str, token: str, model: str) -> list[str]:
    """The two settings docs/notebooks.md gives, as command-line options."""
    parameters = {f"openai/{model}": {"api_base": f"{url}/infer/v1", "api_key": token}}
    return [f"--JupyternautExtension.initial_language_model=openai/{model}",
            f"--JupyternautExtension.model_parameters={json.dumps(parameters)}"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    python = tool_venvs.ensure("jupyter-ai")
    home = tmp_path_factory.mktemp("jupyter-ai")
    root, port = home / "work", free_port()  # started in root, as a user starts it in her work
    root.mkdir()
    env = {**tool_venvs._clean_env(),
           # Our environment's Jupyter config (our extension enabled) beside Jupyter AI's own.
           "JUPYTER_CONFIG_PATH": str(Path(sys.prefix) / "etc" / "jupyter"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no fetch of litellm's price list: offline
    log = open(home / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(python), "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={port}",
         f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}", "--InferApp.engine=simulated",
         "--InferApp.simulated_token_delay_ms=1", "--InferApp.simulated_token_delay_ms=1",
         # Jupyter AI's MCP server: not its fixed 3001, busy elsewhere (0 makes its client dial port 0).
         f"--MCPExtensionApp.mcp_port={free_port()}",
         *jupyternaut_options(f"http://127.0.0.1:{port}", TOKEN, "simulated")],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_parent())
    server = Lab(root, port, proc)
    try:
        deadline = time.monotonic() + 120
        while not _ready(server):
            assert proc.poll() is None and time.monotonic() < deadline, (home / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield server
    finally:
        stop_process(proc)
        log.close()


def _ready(lab: Lab) -> bool:
    try:
        return lab.get("infer/status").json().get("state") == "ready"
    except (httpx.HTTPError, ValueError):
        return False


async def ask_jupyternaut(lab: Lab, chat: str, text: str) -> list[dict[str, Any]]:
    """Send ``text`` to Jupyternaut in a new chat file and wait for its reply, as the lab's
    chat panel does; the chat's messages, once it has stopped writing."""
    async with httpx.AsyncClient(headers={"Authorization": f"token {TOKEN}"}) as http:
        made = await http.put(f"{lab.url}/api/contents/{chat}", json={"type": "file", "format": "text", "content": ""})
        assert made.status_code == 201, made.text
    ws = await websocket_connect(f"ws://127.0.0.1:{lab.port}/api/chat/ws/{chat}?token={TOKEN}")
    try:
        messages = {m["id"]: m for m in json.loads(await ws.read_message())["messages"]}
        await asyncio.sleep(1)  # the persona manager joins the chat just after it opens
        await ws.write_message(json.dumps({
            "type": "client", "action": "send", "id": uuid.uuid4().hex, "body": f"@Jupyternaut {text}",
            "mentions": [NAUT], "metadata": {"to_persona": NAUT}}))  # what the persona picker stamps
        replied = False
        while True:
            try:  # once it has replied, a pause ends the wait too (an error reply is not streamed)
                frame = json.loads(await asyncio.wait_for(ws.read_message(), 5 if replied else 120))
            except TimeoutError:
                assert replied, "no reply from Jupyternaut"
                return list(messages.values())
            if frame.get("action") == "message":
                messages[frame["message"]["id"]] = frame["message"]
            replied = any(m["sender"] == NAUT for m in messages.values())
            if frame.get("action") == "writing" and not frame["state"] and replied:
                return list(messages.values())
    finally:
        ws.close()


def reply(messages: list[dict[str, Any]]) -> str:
    [answer] = [m["body"] for m in messages if m["sender"] == NAUT]
    return answer


def requests_ok(lab: Lab) -> int:
    return lab.get("infer/metrics").json()["requests"]["ok"]


async def test_jupyternaut_answers_through_our_server(lab: Lab) -> None:
    before = requests_ok(lab)
    answer = reply(await ask_jupyternaut(lab, "question.chat", "What is the KV cache?"))
    assert not answer.startswith("Error"), answer
    assert "cache" in answer.lower() and len(answer.split()) >= 40, answer  # the simulated engine's whole answer
    assert requests_ok(lab) == before + 1


async def test_jupyternaut_calls_its_bash_tool_through_our_server(lab: Lab) -> None:
    before = requests_ok(lab)
    answer = reply(await ask_jupyternaut(lab, "tool.chat", "please use bash to run `touch made-by-jupyternaut.txt`"))
    assert (lab.root / "made-by-jupyternaut.txt").exists()  # the call our server wrote, run by Jupyternaut
    assert not answer.startswith("Error") and len(answer.split()) >= 40, answer  # then its answer, in text
    assert requests_ok(lab) == before + 2  # the turn that called the tool, the turn after its result


async def test_our_errors_reach_the_chat_as_jupyternaut_shows_them(lab: Lab) -> None:
    """A prompt past the context is litellm's ContextWindowExceededError in the chat (what it
    raises for our ``context_length_exceeded``), with our message saying why."""
    answer = reply(await ask_jupyternaut(lab, "long.chat", "word " * 40_000))
    assert answer.startswith("Error") and "ContextWindowExceededError" in answer and "maximum context length is 32768 tokens" in answer, answer
