"""``jupyter infer serve``: the extension alone in a Jupyter server (no notebook UI), the
server's own options passed through, and a clean stop on ^C. As a hub service:
tests/server/test_hub_service.py."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest

from jupyter_infer.commands import serve
from jupyter_infer.commands.cli import main
from jupyter_infer.cpu.child_process import dies_with_parent
from jupyter_infer.kernel.launcher import free_port
from jupyter_infer.values.config import ServiceConfig

pytestmark = pytest.mark.timeout(90)


def test_options_it_does_not_know_go_to_the_jupyter_server() -> None:
    seen = []
    with mock.patch.object(serve, "run", lambda args: seen.append(args) or 0):
        assert main(["serve", "--InferApp.engine=simulated", "--port", "9", "--no-hub", "--help-all"]) == 0
    assert seen[0].server_args == ["--InferApp.engine=simulated", "--port", "9", "--help-all"]
    assert seen[0].hub is False
    with pytest.raises(SystemExit):
        main(["demo", "--InferApp.engine=simulated"])  # other commands still refuse what they do not know


def test_the_shorthand_flags_become_the_traits_they_stand_for() -> None:
    seen = []
    with mock.patch.object(serve, "run", lambda args: seen.append(args) or 0):
        assert main(["serve", "--model", "small", "--max-model-len", "4096", "--threads", "2"]) == 0
    assert serve.shorthand_args(seen[0]) == ["--InferApp.model=small", "--InferApp.num_threads=2",
                                             "--InferApp.max_model_len=4096"]


def test_it_is_a_hub_service_only_when_the_hub_started_it() -> None:
    service = {"JUPYTERHUB_SERVICE_NAME": "infer", "JUPYTERHUB_API_TOKEN": "t"}
    assert serve.as_hub_service(None, service)
    # A terminal in a user's own server on the hub has a token but no service name.
    assert not serve.as_hub_service(None, {"JUPYTERHUB_API_TOKEN": "t", "JUPYTERHUB_USER": "alice"})
    assert serve.as_hub_service(True, {}) and not serve.as_hub_service(False, service)
    assert serve.server_extensions(True) == {"jupyter_infer": True, "jupyterhub": True}
    assert serve.server_extensions(False) == {"jupyter_infer": True}


def test_hub_mode_without_the_hubs_environment_says_what_is_missing(capsys: pytest.CaptureFixture) -> None:
    with mock.patch.dict(os.environ, {"JUPYTERHUB_API_TOKEN": ""}):
        assert main(["serve", "--hub"]) == 2
    assert "JUPYTERHUB_API_TOKEN and JUPYTERHUB_SERVICE_URL" in capsys.readouterr().err


def test_serve_runs_the_extension_alone_and_stops_cleanly_on_interrupt(tmp_path: Path) -> None:
    proc, url, auth, log = start_serve(tmp_path, "--InferApp.engine=simulated")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/infer/health", headers=auth).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        assert httpx.get(f"{url}/infer/status", headers=auth).json()["engine"] == "simulated"
        assert httpx.get(f"{url}/infer/status").status_code == 403  # the token is needed
        root = httpx.get(f"{url}/", headers=auth)
        assert root.status_code == 302 and root.headers["Location"].split("?")[0] == "/infer/"
        landing = httpx.get(f"{url}/infer/", headers=auth)
        assert landing.status_code == 302 and landing.headers["Location"].split("?")[0] == "/infer/status"
        # No notebook UI, though JupyterLab is installed here and enables itself for `jupyter server`.
        assert httpx.get(f"{url}/lab", headers=auth).status_code == 404
        assert httpx.get(f"{url}/api/terminals", headers=auth).status_code == 404
        assert list((tmp_path / "runtime").glob("jpserver-*.json"))

        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert "inference service stopped" in (tmp_path / "serve.log").read_text()
        assert not list((tmp_path / "runtime").glob("jpserver-*.json"))  # it cleaned up after itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_an_interrupt_another_thread_receives_stops_the_server_at_once() -> None:
    """The kernel may deliver SIGINT to any thread of the server (the engine's, OpenMP's): the
    stop must not wait for the loop's next timer (a CI run sat through 30 s after ^C)."""
    import asyncio
    import threading

    from tornado.ioloop import IOLoop

    loop = asyncio.new_event_loop()
    stopped: list[float] = []
    app = mock.Mock(io_loop=IOLoop(asyncio_loop=loop, make_current=False))
    app.stop.side_effect = lambda from_signal: (stopped.append(time.monotonic()), loop.stop())
    previous = signal.getsignal(signal.SIGINT)
    other = threading.Event()
    worker = threading.Thread(target=other.wait, args=(30,))
    try:
        serve.stop_on_interrupt(app)
        worker.start()
        loop.call_later(0.3, signal.pthread_kill, worker.ident, signal.SIGINT)  # to the worker, not the loop's thread
        loop.call_later(20, loop.stop)  # the loop's only timer: what a plain handler would wait for
        start = time.monotonic()
        loop.run_forever()
        assert stopped and stopped[0] - start < 5
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # a second ^C exits at once
    finally:
        other.set()
        worker.join()
        signal.signal(signal.SIGINT, previous)
        loop.close()


@pytest.mark.parametrize("alone", [True, False])
def test_a_local_server_alone_is_serve_and_otherwise_carries_jupyterlab(alone: bool) -> None:
    # The bench sets `LocalServer(alone=True)` beside llama-server: our server and nothing else.
    from jupyter_infer import Client
    from jupyter_infer.kernel.launcher import LocalServer

    with LocalServer(alone=alone, engine="simulated") as server:
        # `api/status` answers before the engine has loaded (`engine` is None until then): wait
        # as the bench does. A slow CI machine caught the test reading too early.
        with Client(server.url, server.token, embedded=False) as client:
            assert client.wait_ready(timeout=120)["engine"] == "simulated"
        lab = httpx.get(server.url + "lab", headers=server.headers)
        assert lab.status_code == (404 if alone else 200)


def test_serve_takes_the_flags_users_type_and_a_named_model_that_is_not_there_fails_loudly(tmp_path: Path) -> None:
    """``--model`` is ours (the Jupyter server only warned "Unrecognized alias" and the
    simulated engine answered); a named model that is not there is a failed state that says
    where and what to do, within seconds, and every request is refused with it."""
    missing = tmp_path / "my-model"
    proc, url, auth, log = start_serve(tmp_path, "--model", str(missing), "--quantize", "int4", "--no-hub")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                status = httpx.get(f"{url}/infer/status", headers=auth).json()
                if status["state"] != "loading":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        assert status["state"] == "failed" and status["engine"] is None, status
        assert f"No model at {missing}" in status["load_error"] and "make-model" in status["load_error"]
        assert status["configured"]["model"] == str(missing) and status["configured"]["quantize"] == "int4"
        answer = httpx.post(f"{url}/infer/v1/completions", headers=auth,
                            json={"model": str(missing), "prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 503 and f"No model at {missing}" in answer.json()["error"]["message"]
        assert f"No model at {missing}" in (tmp_path / "serve.log").read_text()
    finally:
        proc.kill()
        proc.wait()
        log.close()


def test_serve_with_an_option_it_cannot_take_exits_saying_why(tmp_path: Path) -> None:
    """A server alone whose service could only answer 503 (``--quantize int3``) is no use: it
    says what is wrong and exits non-zero (it kept running, answering 503)."""
    proc, _, _, log = start_serve(tmp_path, "--quantize", "int3", "--no-hub")
    try:
        assert proc.wait(timeout=60) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    said = (tmp_path / "serve.log").read_text()
    assert "InferApp.quantize must be one of none, int8, int4; got 'int3'" in said and "start again" in said


def test_an_option_of_the_wrong_type_exits_too_not_serving_with_every_option_dropped(tmp_path: Path) -> None:
    """A value traitlets refuses (one number where two are wanted) failed the extension's linking:
    jupyter_server logged it and served on with every --InferApp option dropped (the engine too)."""
    proc, _, _, log = start_serve(tmp_path, "--InferApp.engine=simulated", "--InferApp.simulated_token_delay_ms=5",
                                  "--no-hub")
    try:
        assert proc.wait(timeout=60) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    said = (tmp_path / "serve.log").read_text()
    assert "simulated_token_delay_ms" in said and "wrong type" in said and "start again" in said


def test_a_list_written_on_the_command_line_is_refused_saying_how_to_give_it() -> None:
    """``--InferApp.model_dirs=['/x']`` reaches the trait as one folder named "['/x']" (it listed
    nothing, silently)."""
    with pytest.raises(ValueError, match=r"repeat the option"):
        ServiceConfig(model_dirs=("['/x']",))
    assert ServiceConfig(model_dirs=("/x", "/y")).model_dirs == ("/x", "/y")


def start_serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str, dict[str, str], Any]:
    """``jupyter infer serve *args`` on a free port with a token, its log in tmp_path/serve.log:
    the process, its URL, the auth header and the open log (the caller closes it)."""
    port, token = free_port(), secrets.token_hex(8)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the caller closes it
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_infer.commands.cli", "serve", *args,
         f"--port={port}", "--ip=127.0.0.1", f"--IdentityProvider.token={token}"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=dies_with_parent(),
    )
    return proc, f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"}, log
