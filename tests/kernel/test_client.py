"""``jupyter_infer.Client`` against a real Jupyter server with the extension, and embedded.

Discovery: explicit, environment, the kernel's own server (a kernel that the server started,
driven over ZMQ), and the embedded fallback. The sync API outside and inside a running loop.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_helpers import fast_service
from jupyter_client import BlockingKernelClient
from jupyter_core.paths import jupyter_runtime_dir

from jupyter_infer import Client
from jupyter_infer.errors import EngineUnavailable, InferError, InvalidRequest, ServerTimeout
from jupyter_infer.kernel.client import (
    AsyncTokenStream,
    Completion,
    arrival_times,
    discover,
    embedded,
    find_kernel_server,
)
from jupyter_infer.kernel.client.discovery import clear_cache
from jupyter_infer.kernel.client.http import VIEW_TIMEOUT_S
from jupyter_infer.kernel.launcher import LocalServer

FAST = {"engine": "simulated", "simulated_token_delay_ms": [1.0, 3.0]}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with pytest.MonkeyPatch.context() as mp:
        # The server's kernels inherit its environment: no shortcut to the answer there.
        for name in ("JUPYTER_INFER_URL", "JUPYTER_INFER_TOKEN", "JPY_PARENT_PID"):
            mp.delenv(name, raising=False)
        with LocalServer(**FAST) as running:
            yield running


@pytest.fixture(autouse=True)
def fresh_discovery() -> Iterator[None]:
    """Each test looks for its server anew (discovery is cached per process)."""
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JUPYTER_INFER_URL", "JUPYTER_INFER_TOKEN", "JPY_PARENT_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fast_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded fallback builds a fast simulated engine (not the default auto one)."""
    monkeypatch.setattr(embedded, "_shared_service", None)
    monkeypatch.setattr(embedded, "make_embedded_service", fast_service)


def embedded_client() -> Client:
    return Client(embedded=fast_service())


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


def test_on_a_hub_the_shared_service_takes_the_users_hub_token(
    server: LocalServer, no_discovery: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hub admin sets JUPYTER_INFER_URL for every user; each user's kernel has their own
    # JUPYTERHUB_API_TOKEN, which is what the shared service authenticates (docs/deployment.md).
    monkeypatch.setenv("JUPYTER_INFER_URL", server.url)
    monkeypatch.delenv("JUPYTER_INFER_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", server.token)
    client = Client()
    assert (client.backend, client.connection.source) == ("server", "environment")
    assert client.connection.token == server.token and client.status()["engine"] == "simulated"


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


def test_embedded_engines_log_their_fallback_once_quietly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Two embedded ``auto`` engines whose built-in default model cannot load (notebook 02 runs
    two, offline): one INFO record (a WARNING reaches a cell as red stderr), and each status says why."""
    from jupyter_infer.kernel.client import embedded
    from jupyter_infer.service.inference import InferenceService
    from jupyter_infer.values.config import DEFAULT_MODEL, ServiceConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Once per process and reason: an earlier test in this process may have said it already.
    monkeypatch.setattr(embedded._quiet_fallback, "logged", set())
    caplog.set_level(logging.INFO, logger="jupyter_infer.engine")
    for mode in ("window", "continuous"):
        with Client(embedded=InferenceService(ServiceConfig(mode=mode))) as client:
            status = client.wait_ready()
            assert status["engine"] == "simulated" and DEFAULT_MODEL in status["fallback_reason"]
    fallbacks = [r for r in caplog.records if "falling back to the simulated engine" in r.getMessage()]
    assert [r.levelname for r in fallbacks] == ["INFO"]


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


def test_discovery_is_cached_per_process(
    server: LocalServer, no_discovery: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_infer.kernel.client import discovery

    probed: list[str] = []
    monkeypatch.setattr(discovery, "probe", lambda url, token: probed.append(url))  # answers: None = ok
    monkeypatch.setenv("JUPYTER_INFER_URL", server.url)
    first = discover()
    assert first.source == "environment" and discover() is first and len(probed) == 1
    assert Client().connection is first and len(probed) == 1  # a second client asks no one
    assert discover(refresh=True) is not first and len(probed) == 2
    monkeypatch.setenv("JUPYTER_INFER_URL", "127.0.0.1:9/")  # another environment: looked up anew
    assert discover().url == "http://127.0.0.1:9/" and len(probed) == 3


def test_discover_explicit_adds_scheme_and_slash() -> None:
    conn = discover("127.0.0.1:9/base", "t")
    assert (conn.url, conn.token, conn.source) == ("http://127.0.0.1:9/base/", "t", "explicit")


# -- the sync API, outside and inside a running loop ------------------------------------------
def test_sync_api_outside_a_loop(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    stream = client.stream("Explain the KV cache", max_tokens=12)
    pieces = list(stream)
    assert len(pieces) == 12 and stream.text == "".join(pieces)
    done = stream.completion  # the server's final result: its count, batch and timings
    assert (done.id, done.text, done.completion_tokens, done.counted_fragments) == (stream.id, stream.text, 12, False)
    assert done.batch_id is not None and done.ttft_ms is not None and done.prompt == "Explain the KV cache"
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
        client.run(client.agenerate("hi", max_tokens=-1))
    client.close()


def test_burst_with_poisson_arrivals(server: LocalServer) -> None:
    client = Client(server.url, server.token)
    # Each answer takes at least 300 decode steps of at least 1 ms (the server's simulated
    # delay is a sleep): longer than the arrivals' whole span (0.12 s), on any machine.
    results = client.burst(["What is attention?"] * 5, rate=20, seed=3, max_tokens=300, ignore_eos=True)
    assert [r.completion_tokens for r in results] == [300] * 5
    sent = [r.sent_at - results[0].sent_at for r in results]
    offsets = arrival_times(5, 20, seed=3)
    # Each request left at its arrival time: never before it, in arrival order, and without
    # waiting for any answer: all had left before the first one came back. (A late timer on a
    # loaded machine delays the sends and the answers alike; no wall-clock bound needed.)
    assert all(s >= o - 0.005 for s, o in zip(sent, offsets, strict=True)), (sent, offsets)
    assert sent == sorted(sent), (sent, offsets)
    first_back = min(r.received_at for r in results)
    assert max(r.sent_at for r in results) < first_back, (sent, first_back - results[0].sent_at)


def test_arrival_times_are_poisson() -> None:
    assert arrival_times(4, None) == arrival_times(4, 0) == [0.0] * 4  # all at once
    assert arrival_times(50, 10, seed=1) == arrival_times(50, 10, seed=1)  # seeded
    assert arrival_times(50, 10, seed=1) != arrival_times(50, 10, seed=2)
    n, rate = 20_000, 50.0
    times = arrival_times(n, rate, seed=7)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 0 and min(gaps) >= 0
    # Exponential gaps: mean 1/rate, standard deviation 1/rate; the mean of n-1 gaps lies
    # within 5 standard errors of 1/rate (a false alarm about once in 3.5 million runs).
    mean = sum(gaps) / len(gaps)
    assert abs(mean - 1 / rate) < 5 * (1 / rate) / len(gaps) ** 0.5
    share_below_mean = sum(g < 1 / rate for g in gaps) / len(gaps)
    assert share_below_mean == pytest.approx(1 - 2.718281828 ** -1, abs=0.02)  # P(gap < mean) = 1 - 1/e


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
        client.generate("hi", max_tokens=-1)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        list(client.stream("hi", max_tokens=-1))
    with pytest.raises(InferError, match="refused.*JUPYTER_INFER_TOKEN"):
        Client(server.url, "wrong").status()
    burst = client.burst(["ok", "hi"], max_tokens=2, stop=123)
    assert all(r.finish_reason == "error" and "stop" in r.error for r in burst)


def test_cancel_one_request_from_another_client(server: LocalServer) -> None:
    reader, other = Client(server.url, server.token), Client(server.url, server.token)
    stream = reader.stream("Explain batching at length", max_tokens=400)
    pieces = iter(stream)
    next(pieces)
    assert other.cancel(stream.id) is True
    rest = list(pieces)  # the stream ends normally, early
    done = stream.completion
    assert done.finish_reason == "cancelled" and done.completion_tokens == 1 + len(rest) < 400
    assert other.cancel(stream.id) is False  # over: nothing to cancel
    assert other.cancel("req-never-was") is False


def test_cancelled_readers_leave_no_stray_task_errors(server: LocalServer, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 11: after the panel's Cancel, the next cell showed "Task exception was never
    retrieved ... aclose(): asynchronous generator is already running": readers on the
    kernel's loop were cancelled while their stream's step ran on the client's loop."""
    client = Client(server.url, server.token)
    before = client.metrics()["requests"]

    cut_short = 0  # readers cancelled while their stream still ran

    async def cancel_mid_stream(rounds: int = 10, readers: int = 3) -> None:
        nonlocal cut_short
        for i in range(rounds):
            streaming = [asyncio.Event() for _ in range(readers)]

            async def read(started: asyncio.Event) -> None:
                # As long as the server allows: a loaded client must still cancel before its end.
                # ignore_eos: each answer runs to 512 tokens (~10 s), so the server still streams
                # it when the cancel lands, however slow a loaded machine makes the readers.
                async for _ in client.astream("Explain batching at length", max_tokens=512, ignore_eos=True):
                    started.set()

            tasks = [asyncio.ensure_future(read(started)) for started in streaming]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 30)
            await asyncio.sleep(0.001 * i)  # land the cancel at varying points of a step
            for task in tasks:
                task.cancel()
            ends = await asyncio.gather(*tasks, return_exceptions=True)
            cut_short += sum(isinstance(end, asyncio.CancelledError) for end in ends)
            del tasks
            gc.collect()  # dropped streams are finalized now, as a notebook's would be later

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(cancel_mid_stream())
        deadline = time.monotonic() + 30
        while client.metrics()["requests"]["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        gc.collect()
    after = {k: v - before[k] for k, v in client.metrics()["requests"].items()}
    # Every request reached the server and ended there: cancelled, or run to its end when its
    # reader was slower than the stream (under load) or the server missed the closed
    # connection (rare; main's client saw that too).
    assert cut_short > 0 and after["cancelled"] > 0
    assert after["running"] == 0 and after["cancelled"] + after["ok"] == 30
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_stopped_server_does_not_hang_the_client(server: LocalServer) -> None:
    """Issue 9: with the server frozen (SIGSTOP), calls end with ServerTimeout in bounded time."""
    client = Client(server.url, server.token, read_timeout=1.0)
    stream = client.stream("Explain batching at length", max_tokens=400)
    pieces = iter(stream)
    next(pieces)
    os.kill(server._proc.pid, signal.SIGSTOP)
    try:
        # Which timer ended each call is in its message ("sent nothing for 1 s": read_timeout).
        # The clock only backs that up, generously: a call ends after one or two read timeouts
        # (1-2 s); the next timers that could end it are VIEW_TIMEOUT_S and CONNECT_TIMEOUT_S
        # (10 s), so a call reaching 10 s waited on something other than read_timeout.
        for call in (lambda: list(pieces), client.status,
                     lambda: client.generate("What is a token?", max_tokens=4)):
            started = time.monotonic()
            with pytest.raises(ServerTimeout, match=r"sent nothing for 1 s .*may be frozen"):
                call()
            assert time.monotonic() - started < VIEW_TIMEOUT_S
    finally:
        os.kill(server._proc.pid, signal.SIGCONT)
    assert client.status()["state"] == "ready"  # served again once resumed


def test_unreachable_server() -> None:
    from jupyter_infer.kernel.launcher import free_port

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
    client = Client(embedded=fast_service((10.0, 20.0)))  # answers outlast the test
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
    stream = client.astream("Explain speculative decoding", max_tokens=300)
    cancelled = False
    async for _ in stream:
        cancelled = cancelled or await client.acancel(stream.id)  # by id, as a panel's row does
    assert cancelled
    assert stream.completion.finish_reason == "cancelled" and stream.completion.completion_tokens < 300
    assert client.metrics()["requests"]["cancelled"] == 3
    assert await client.acancel(stream.id) is False
    await client.__aexit__()


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

