"""The client's HTTP backend against scripted servers: the final result event, old servers,
frozen servers (timeouts), error answers without a body, cancelling one request."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from client_helpers import ScriptedServer, answer, answer_json, sse, start_event_stream

from jupyter_infer import Client
from jupyter_infer.errors import InferError, QueueFull, RequestFailed, ServerTimeout
from jupyter_infer.kernel.client.http import VIEW_TIMEOUT_S

# The frozen-server tests name the timer that ended a call by its message ("sent nothing for
# 0.5 s" is read_timeout's); the clock only backs that up, with a bound far above the timeouts
# they set (0.3-1 s) and below the next timers that could end the call instead
# (VIEW_TIMEOUT_S and CONNECT_TIMEOUT_S, 10 s): a call that reaches it waited on the wrong one.
WRONG_TIMER_S = VIEW_TIMEOUT_S / 2

RESULT = {
    "id": "req-1", "text": "Hello,\nworld", "finish_reason": "length",
    "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9},
    "batch": {"id": 7, "size": 3}, "timings": {"queued_ms": 1.5, "ttft_ms": 12.0, "total_ms": 80.0},
}


def stream_script(*, result: bool = True, silent_after: int | None = None, keepalives: int = 0):
    """An SSE answer: two fragments (five tokens: the engine sent some together), then
    ``result`` and ``done``; or silence after ``silent_after`` fragments."""

    async def script(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        if path.endswith("infer/status"):
            answer_json(writer, {"state": "ready", "limits": {}})
            return
        start_event_stream(writer)
        for i, fragment in enumerate(["Hello,\nwor", "ld"]):
            if silent_after is not None and i == silent_after:
                await writer.drain()
                await asyncio.sleep(3600)  # frozen: the connection stays open, nothing comes
            for _ in range(keepalives):
                writer.write(b": keepalive\n\n")
                await writer.drain()
                await asyncio.sleep(0.1)
            writer.write(sse(fragment, "token"))
        if result:
            writer.write(sse(json.dumps(RESULT), "result"))
        writer.write(sse("[DONE]", "done"))
        await writer.drain()
        writer.close()

    return script


def test_a_stream_ends_with_the_servers_result() -> None:
    with ScriptedServer(stream_script()) as server:
        client = Client(server.url, "t")
        stream = client.stream("hi", max_tokens=5)
        assert list(stream) == ["Hello,\nwor", "ld"]  # a fragment with a line break comes whole
        done = stream.completion
        assert (done.id, done.text, done.finish_reason) == ("req-1", "Hello,\nworld", "length")
        assert (done.completion_tokens, stream.tokens, stream.fragments) == (5, 5, 2)  # the true count
        assert (done.batch_id, done.batch_size, done.ttft_ms, done.total_ms) == (7, 3, 12.0, 80.0)
        assert not done.counted_fragments and done.prompt == "hi" and done.sent_at <= done.received_at

        async def read() -> tuple[int, bool]:
            stream = client.astream("hi")
            assert stream.completion is None
            async for _ in stream:
                pass
            return stream.completion.completion_tokens, stream.completion.counted_fragments

        assert asyncio.run(read()) == (5, False)
        client.close()


def test_an_older_server_without_a_result_counts_fragments_and_says_so() -> None:
    with ScriptedServer(stream_script(result=False)) as server:
        client = Client(server.url, "t")
        stream = client.stream("hi")
        text = "".join(stream)
        done = stream.completion
        assert done.text == text and done.id == "req-1"
        assert done.completion_tokens == stream.tokens == 2 and done.counted_fragments
        assert done.ttft_ms == stream.ttft_ms and done.batch_id is None
        client.close()


def test_a_silent_stream_ends_with_a_timeout_not_a_hang() -> None:
    with ScriptedServer(stream_script(silent_after=1)) as server:
        client = Client(server.url, "t", read_timeout=0.5)
        stream = client.stream("hi")
        pieces = []
        started = time.monotonic()
        with pytest.raises(ServerTimeout, match="sent nothing for 0.5 s") as caught:
            for piece in stream:
                pieces.append(piece)
        assert time.monotonic() - started < WRONG_TIMER_S  # the server stays silent for an hour
        assert pieces == ["Hello,\nwor"] and stream.error and stream.completion is None
        assert isinstance(caught.value, TimeoutError)
        assert "still runs" in caught.value.message  # says what to do


def test_keepalives_keep_a_slow_stream_open() -> None:
    """The read timeout is on silence, not on the whole stream: keepalives restart it."""
    with ScriptedServer(stream_script(keepalives=8)) as server:
        client = Client(server.url, "t", read_timeout=0.5)
        stream = client.stream("hi")
        started = time.monotonic()
        assert "".join(stream) == "Hello,\nworld"
        # The script sleeps 16 x 0.1 s between its keepalives: a lower bound that a slow machine
        # only makes longer. The stream outlived three read timeouts, and none fired.
        assert time.monotonic() - started > 3 * 0.5
        assert stream.completion.completion_tokens == 5


def test_a_frozen_server_fails_every_call_in_time() -> None:
    async def frozen(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)  # accepted, read, never answered

    with ScriptedServer(frozen) as server:
        client = Client(server.url, "t", read_timeout=0.5, timeout=60)
        for call in (lambda: client.generate("hi"), client.status, client.metrics,
                     lambda: client.batches(5), lambda: list(client.stream("hi")), lambda: client.cancel("req-1")):
            started = time.monotonic()
            with pytest.raises(ServerTimeout, match=r"sent nothing for 0.5 s .*may be frozen"):
                call()
            assert time.monotonic() - started < WRONG_TIMER_S


def test_a_whole_answer_is_bounded_by_timeout() -> None:
    """A server that answers its status but never the request: ``timeout`` ends the wait."""

    async def slow(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        if path.endswith("infer/status"):
            answer_json(writer, {"state": "ready"})
            return
        await asyncio.sleep(3600)

    with ScriptedServer(slow) as server:
        client = Client(server.url, "t", read_timeout=0.3, timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ServerTimeout, match="within 1 s"):
            client.generate("hi")
        # Not before the whole-answer timeout (a lower bound: slowness only adds), and ended by
        # it: the server never answers, so nothing else would end the wait this side of an hour.
        assert 1.0 <= time.monotonic() - started < 1.0 + WRONG_TIMER_S
        assert server.requests.count(("GET", "/infer/status")) >= 2  # it checked the server lived


def test_429_with_an_empty_body_says_what_happened() -> None:
    async def full(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        answer(writer, "429 Too Many Requests", headers={"Retry-After": "2"})

    with ScriptedServer(full) as server:
        client = Client(server.url, "t")
        for call in (lambda: client.generate("hi"), lambda: list(client.stream("hi"))):
            with pytest.raises(QueueFull) as caught:
                call()
            assert caught.value.status == 429 and caught.value.retry_after == 2.0
            assert "queue is full" in caught.value.message and "Retry in 2 s" in caught.value.message
        burst = client.burst(["a", "b"])
        assert all(r.finish_reason == "error" and "queue is full" in r.error for r in burst)


def test_an_error_event_ends_the_stream_with_its_message() -> None:
    async def failing(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        start_event_stream(writer)
        writer.write(sse("Hel", "token") + sse(json.dumps({"message": "The engine failed: boom"}), "error"))
        await writer.drain()
        writer.close()

    with ScriptedServer(failing) as server:
        stream = Client(server.url, "t").stream("hi")
        with pytest.raises(RequestFailed, match="boom"):
            list(stream)
        assert stream.text == "Hel" and stream.error == "The engine failed: boom"


def test_cancel_one_request_by_id() -> None:
    async def script(method: str, path: str, writer: asyncio.StreamWriter) -> None:
        assert method == "DELETE"
        if path == "/infer/requests/req-live":
            answer_json(writer, {"id": "req-live", "cancelled": True})
        elif path == "/infer/requests/req-gone":
            answer_json(writer, {"message": "No request req-gone is queued or running."}, "404 Not Found")
        else:
            answer(writer, "404 Not Found", b"<html>404: Not Found</html>", {"Content-Type": "text/html"})

    with ScriptedServer(script) as server:
        client = Client(server.url, "t")
        assert client.cancel("req-live") is True
        assert asyncio.run(client.acancel("req-gone")) is False
        with pytest.raises(InferError, match="cannot cancel one request"):
            client.cancel("req-x/old-server")  # a server without the route
