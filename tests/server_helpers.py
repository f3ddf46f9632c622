"""What the server tests share: the server config, a scripted engine, an SSE parser."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from jupyter_infer.engine import Sampled
from jupyter_infer.engine.simulated import SimulatedEngine
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"token {TOKEN}"}

def service_of(serverapp: Any) -> Any:
    """The ``InferenceService`` of a running server (what the handlers talk to)."""
    from jupyter_infer.server.handler_base import SERVICE_KEY

    return serverapp.web_app.settings[SERVICE_KEY]


# Prompts the scripted engine treats specially.
POISON = "POISON"  # the prefill step of a request with this prompt fails
SCRIPTS = {
    "MULTILINE": "one two\nthree\n\nfour \r\nend",  # words the simulated vocabulary knows
    "SHORT": "one two\nthree",
}


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a server the test started: SIGTERM, then SIGKILL if it has not gone in ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_config(**infer: Any) -> dict[str, Any]:
    """pytest-jupyter config: the extension on, auth required, a fast simulated engine."""
    options = {
        "engine": "simulated",
        "simulated_token_delay_ms": [0.0, 0.0],
        "simulated_prefill_ms_per_token": 0.0,
        **infer,
    }
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_infer": True, "jupyter_server_terminals": False},
            "allow_unauthenticated_access": False,
        },
        "IdentityProvider": {"token": TOKEN},
        "InferApp": options,
    }


class ScriptedEngine(SimulatedEngine):
    """The simulated engine, plus fixed answers for ``SCRIPTS`` prompts and a poison pill."""

    def prefill(self, seqs: list[Any], *args: Any) -> Sampled:
        if any(POISON in s.request.prompt for s in seqs):
            raise RuntimeError("the scripted engine refuses poisoned prompts")
        return super().prefill(seqs, *args)

    def answer(self, seq: Any) -> list[int]:
        script = next((text for key, text in SCRIPTS.items() if key in seq.request.prompt), None)
        return self.text.tokenize(script) if script is not None else super().answer(seq)


@dataclass
class EngineGate:
    """Holds engine loading until ``open()``: lets a test see the ``loading`` state."""

    loaded: list[ServiceConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        import threading

        self.event = threading.Event()

    def open(self) -> None:
        self.event.set()


def use_scripted_engine(monkeypatch: pytest.MonkeyPatch, gate: EngineGate | None = None) -> None:
    """Make every InferenceService load a ``ScriptedEngine`` built from its config."""

    def load(config: ServiceConfig) -> ScriptedEngine:
        if gate is not None:
            assert gate.event.wait(30), "the test never opened the engine gate"
            gate.loaded.append(config)
        return ScriptedEngine(
            seed=config.seed, token_delay_ms=config.simulated_token_delay_ms,
            prefill_ms_per_token=config.simulated_prefill_ms_per_token,
        )

    monkeypatch.setattr("jupyter_infer.loops.loop_factory.load_engine", load)


# -- Server-Sent Events, parsed as the spec says ---------------------------------------------
@dataclass
class SSEEvent:
    event: str
    data: str
    id: str | None


def parse_sse(text: str) -> tuple[list[SSEEvent], list[str]]:
    """Events and comments of a complete ``text/event-stream`` body, per the HTML spec's
    "interpreting an event stream" (an unterminated last event is dropped)."""
    events: list[SSEEvent] = []
    comments: list[str] = []
    data: list[str] | None = None
    kind = ""
    last_id: str | None = None
    lines = re.split(r"\r\n|\r|\n", text)
    for line in lines[:-1]:  # the text after the last line break is not a complete line
        if line == "":
            if data is not None:
                events.append(SSEEvent(kind or "message", "\n".join(data), last_id))
            data, kind = None, ""
            continue
        if line.startswith(":"):
            comments.append(line[1:].removeprefix(" "))
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data = (data or []) + [value]
        elif name == "event":
            kind = value
        elif name == "id" and "\0" not in value:
            last_id = value
    return events, comments


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0) -> None:
    """Poll ``check`` until it holds (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition still false after {timeout:.1f} s")
        await asyncio.sleep(0.02)


async def assert_failed_saying(config: ServiceConfig, reason: str) -> None:
    """A service told to load a model it cannot serve: still up, its status ``failed`` and
    saying ``reason``, every request refused with it (503), never answered by a stand-in."""
    from jupyter_infer.errors import EngineUnavailable

    service = InferenceService(config)
    service.start()
    try:
        with pytest.raises(EngineUnavailable, match=re.escape(reason)):
            await service.wait_ready()
        status = service.status()
        assert status["state"] == "failed" and reason in str(status.get("load_error")), status
        with pytest.raises(EngineUnavailable, match=re.escape(reason)):
            await service.submit(Request("hello", SamplingParams(max_tokens=4)))
    finally:
        await service.stop()
