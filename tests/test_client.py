"""``jupyter_infer.Client`` against a real Jupyter server with the extension, and embedded.

Discovery: explicit, environment, the kernel's own server (a kernel that the server started,
driven over ZMQ), and the embedded fallback. The sync API outside and inside a running loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_core.paths import jupyter_runtime_dir

import jupyter_infer.client as client_module
from jupyter_infer import Client
from jupyter_infer.client import (
    _SSE,
    AsyncTokenStream,
    Completion,
    arrival_times,
    discover,
    find_kernel_server,
)
from jupyter_infer.config import ServiceConfig
from jupyter_infer.errors import EngineUnavailable, InferError, InvalidRequest
from jupyter_infer.server.launcher import LocalServer
from jupyter_infer.service import InferenceService

FAST = {"engine": "simulated", "simulated_token_delay_ms": [1.0, 3.0]}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with pytest.MonkeyPatch.context() as mp:
        # The server's kernels inherit its environment: no shortcut to the answer there.
        for name in ("JUPYTER_INFER_URL", "JUPYTER_INFER_TOKEN", "JPY_PARENT_PID"):
            mp.delenv(name, raising=False)
        with LocalServer(**FAST) as running:
            yield running


@pytest.fixture
def no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JUPYTER_INFER_URL", "JUPYTER_INFER_TOKEN", "JPY_PARENT_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fast_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded fallback builds a fast simulated engine (not the default auto one)."""
    monkeypatch.setattr(client_module, "_shared_service", None)
    monkeypatch.setattr(client_module, "make_embedded_service", lambda: InferenceService(
        ServiceConfig(engine="simulated", simulated_token_delay_ms=(1.0, 3.0))))


def embedded_client() -> Client:
    return Client(embedded=InferenceService(ServiceConfig(engine="simulated", simulated_token_delay_ms=(1.0, 3.0))))


# -- discovery ----------------------------------------------------------------------------------
def test_explicit_url_and_token(server: LocalServer, no_discovery: None) -> None:
    with Client(server.url.rstrip("/"), server.token) as client:
        assert (client.backend, client.connection.source, client.url) == ("server", "explicit", server.url)
        result = client.generate("What is dynamic batching?", max_tokens=8)
    assert isinstance(result, Completion)
    assert result.id.startswith("req-") and result.completion_tokens == 8 and result.finish_reason == "length"
    assert result.batch_id is not None and result.batch_size >= 1 and result.ttft_ms is not None
    assert result.sent_at <= result.received_at


def test_environment(server: LocalServer, no_discovery: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_INFER_URL", server.url)
    monkeypatch.setenv("JUPYTER_INFER_TOKEN", server.token)
    client = Client()
    assert (client.backend, client.connection.source) == ("server", "environment")
    assert client.status()["engine"] == "simulated"


def test_embedded_fallback_with_a_note(
    server: LocalServer, no_discovery: None, fast_embedded: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A server that exists but is not this process's kernel's server is never picked, and a
    # wrong token in the environment does not count as an answer.
    monkeypatch.setenv("JUPYTER_INFER_URL", server.url)
    monkeypatch.setenv("JUPYTER_INFER_TOKEN", "wrong")
    client = Client()
    assert client.backend == "embedded" and client.url is None
    note = capsys.readouterr().err
    assert "running an embedded engine" in note and "refused the token" in note
    assert "JUPYTER_INFER_URL" in note
    result = client.generate("What is the KV cache?", max_tokens=5)
    assert result.completion_tokens == 5
    assert client.status()["engine"] == "simulated"
    with pytest.raises(EngineUnavailable, match="no inference server found"):
        Client(embedded=False)


def test_find_kernel_server_matches_only_this_kernels_server(server: LocalServer) -> None:
    others = [{"url": "http://127.0.0.1:1/", "pid": 999_999_998, "token": "x"}]
    mine = {"url": server.url, "pid": 4242, "token": server.token}
    assert find_kernel_server([*others, mine], parent_pid=4242) is mine
    assert find_kernel_server(others, parent_pid=4242, kernel_id="nope") is None
    # Not the parent (a provisioner in between): matched by the kernel id the server lists.
    kernel = json.loads(_post(server, "api/kernels", {"name": "python3"}))
    try:
        found = find_kernel_server([*others, {**mine, "pid": 1}], parent_pid=4242, kernel_id=kernel["id"])
        assert found is not None and found["url"] == server.url
    finally:
        _delete(server, f"api/kernels/{kernel['id']}")


def test_a_kernel_started_by_the_server_finds_it(server: LocalServer) -> None:
    """The real path: the server starts a kernel; in it, ``Client()`` and the magics find it."""
    kernel = json.loads(_post(server, "api/kernels", {"name": "python3"}))
    kc = BlockingKernelClient()
    try:
        kc.load_connection_file(str(Path(jupyter_runtime_dir()) / f"kernel-{kernel['id']}.json"))
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        out = _run(kc, (
            "import asyncio, os\n"
            "from jupyter_infer import Client\n"
            "c = Client()\n"
            "asyncio.get_running_loop()  # ipykernel 7: the cell runs inside a live loop\n"
            "print(c.connection.source, c.url, 'JUPYTER_INFER_URL' in os.environ)\n"
            "print(c.generate('What is batching?', max_tokens=4).completion_tokens)\n"
        ))
        assert out.split() == ["kernel's", "server", server.url, "False", "4"], out
        out = _run(kc, "%load_ext jupyter_infer\n%infer --max-tokens 6 What is the KV cache")
        assert "6 tokens" in out, out
    finally:
        kc.stop_channels()
        _delete(server, f"api/kernels/{kernel['id']}")


def test_discover_explicit_adds_scheme_and_slash() -> None:
    conn = discover("127.0.0.1:9/base", "t")
    assert (conn.url, conn.token, conn.source) == ("http://127.0.0.1:9/base/", "t", "explicit")


# -- the sync API, outside and inside a running loop ------------------------------------------
def test_sync_api_outside_a_loop(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    stream = client.stream("Explain the KV cache", max_tokens=12)
    pieces = list(stream)
    assert len(pieces) == 12 and stream.text == "".join(pieces)
    assert stream.id.startswith("req-") and stream.ttft_ms is not None and stream.total_ms >= stream.ttft_ms
    with pytest.raises(RuntimeError, match="read once"):
        list(stream)
    assert client.generate("Explain the KV cache", max_tokens=12).text == stream.text  # greedy: same text
    metrics = client.metrics()
    assert metrics["requests"]["ok"] >= 2
    payload = client.batches(limit=5)
    assert payload["batches"] and payload["requests"]
    assert {"id", "members", "started_at", "ended_at", "size"} <= set(payload["batches"][-1])


@pytest.mark.asyncio
async def test_sync_and_async_api_inside_a_running_loop(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    pause = asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        asyncio.run(pause)  # what a cell's loop forbids; the client does not need it
    pause.close()
    assert client.generate("What is RAG?", max_tokens=3).completion_tokens == 3
    assert [p async for p in client.astream("What is RAG?", max_tokens=3)]
    results = await asyncio.gather(*(client.agenerate(f"What is RAG? {i}", max_tokens=6) for i in range(4)))
    assert len({r.id for r in results}) == 4
    assert (await client.astatus())["state"] == "ready"
    assert (await client.abatches(limit=3))["batches"]


def test_burst_all_at_once_shares_a_batch(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    prompts = [f"What is quantization? ({i})" for i in range(6)]
    results = client.burst(prompts, max_tokens=16)
    assert [r.prompt for r in results] == prompts and all(r.ok for r in results)
    assert max(r.batch_size for r in results) >= 3


def test_run_streams_concurrently_on_the_clients_own_loop(server: LocalServer) -> None:
    client = Client(server.url, server.token, embedded=False)
    threads: set[str] = set()

    async def main() -> list[AsyncTokenStream]:
        async def one(i: int) -> AsyncTokenStream:
            stream = client.astream(f"What is a token? ({i})", max_tokens=6 + i)
            async for _ in stream:
                threads.add(threading.current_thread().name)
            return stream

        return await asyncio.gather(*(one(i) for i in range(4)))

    streams = client.run(main())
    assert threads == {"jupyter-infer-io"}  # no hop to another thread per fragment
    assert [s.fragments for s in streams] == [6, 7, 8, 9]
    assert len({s.id for s in streams}) == 4 and all(s.id.startswith("req-") for s in streams)
    for s in streams:  # the client's own times: sent, first fragment, end
        assert s.sent_at <= s.first_token_at <= s.finished_at
        assert 0 < s.ttft_ms <= s.total_ms
    with pytest.raises(InvalidRequest, match="max_tokens"):
        client.run(client.agenerate("hi", max_tokens=0))
    client.close()


def test_burst_with_poisson_arrivals(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    results = client.burst(["What is attention?"] * 5, rate=50, seed=3, max_tokens=4)
    sent = [r.sent_at for r in results]
    offsets = arrival_times(5, 50, seed=3)
    assert sent == sorted(sent) and offsets[0] == 0 and offsets == sorted(offsets)
    assert sent[-1] - sent[0] == pytest.approx(offsets[-1], abs=0.1)


def test_leaving_a_stream_early_cancels_the_request(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    before = client.metrics()["requests"]["cancelled"]
    for i, _ in enumerate(client.stream("Explain batching at length", max_tokens=400)):
        if i == 2:
            break
    deadline = time.monotonic() + 5
    while client.metrics()["requests"]["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.metrics()["requests"]["cancelled"] == before + 1


def test_errors_carry_the_servers_message(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        client.generate("hi", max_tokens=0)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        list(client.stream("hi", max_tokens=0))
    with pytest.raises(InferError, match="refused.*JUPYTER_INFER_TOKEN"):
        Client(server.url, "wrong").status()
    burst = client.burst(["ok", "hi"], max_tokens=2, stop=123)
    assert all(r.finish_reason == "error" and "stop" in r.error for r in burst)


def test_unreachable_server() -> None:
    from jupyter_infer.server.launcher import free_port

    with pytest.raises(EngineUnavailable, match="Cannot reach"):
        Client(f"http://127.0.0.1:{free_port()}/", "t").status()


# -- embedded -----------------------------------------------------------------------------------
def _shape(data: dict) -> dict:
    """A JSON answer's keys, and the keys of its nested objects."""
    return {k: sorted(v) if isinstance(v, dict) else None for k, v in data.items()}


def test_embedded_speaks_the_same_json_as_the_server(server: LocalServer) -> None:
    body = {"prompt": "What is a context window?", "max_tokens": 5}
    with Client(server.url, server.token) as remote_client:
        remote = remote_client.generate(body["prompt"], max_tokens=5)
        remote_json = remote_client.run(remote_client._backend.generate(body))
    client = embedded_client()
    try:
        # The backends' own answers (Completion.to_json has the same keys whatever it was given).
        assert _shape(client.run(client._backend.generate(body))) == _shape(remote_json)
        local = client.generate(body["prompt"], max_tokens=5)
        assert local.text == remote.text
        payload = client.batches(limit=5)
        assert payload["requests"][-1]["id"] == local.id
        assert client.wait_ready()["state"] == "ready"
    finally:
        client.close()
    assert client.service.state == "stopped"


@pytest.mark.asyncio
async def test_embedded_async_and_cancel() -> None:
    slow = ServiceConfig(engine="simulated", simulated_token_delay_ms=(10.0, 20.0))  # answers outlast the test
    client = Client(embedded=InferenceService(slow))
    stream = client.astream("Explain speculative decoding", max_tokens=300)
    async for _ in stream:
        break
    await stream.aclose()
    await asyncio.sleep(0.05)
    assert client.metrics()["requests"]["cancelled"] == 1
    task = asyncio.ensure_future(client.agenerate("Explain speculative decoding", max_tokens=300))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert client.metrics()["requests"]["cancelled"] == 2
    await client.__aexit__()


def test_sse_parser_follows_the_spec() -> None:
    parser = _SSE()
    lines = [": keepalive", "", "event: token", "id: req-1", "data: line one", "data:line two", "",
             "event: token", "data:  three", "", "event: done", "data: [DONE]", ""]
    events = [e for e in map(parser.feed, lines) if e]
    assert events == [("token", "req-1", "line one\nline two"), ("token", "req-1", " three"),
                      ("done", "req-1", "[DONE]")]


# -- helpers ------------------------------------------------------------------------------------
def _post(server: LocalServer, path: str, body: dict) -> bytes:
    import urllib.request

    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={**server.headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read()


def _delete(server: LocalServer, path: str) -> None:
    import urllib.request

    req = urllib.request.Request(server.url + path, method="DELETE", headers=server.headers)
    try:
        urllib.request.urlopen(req, timeout=30).close()
    except OSError:
        pass


def _run(kc: BlockingKernelClient, code: str) -> str:
    chunks: list[str] = []

    def hook(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            chunks.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            chunks.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            chunks.append("ERROR " + content["ename"] + ": " + content["evalue"])

    reply = kc.execute_interactive(code, output_hook=hook, timeout=60)
    assert reply["content"]["status"] == "ok", "".join(chunks)
    return "".join(chunks)

