"""``infer/health`` for probes, and the vLLM-shaped ``infer/tokenize`` / ``infer/detokenize``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from server_helpers import AUTH, EngineGate, eventually, server_config, use_scripted_engine

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def gate() -> EngineGate | None:
    return None


@pytest.fixture
def jp_server_config(infer_options: dict[str, Any], gate: EngineGate | None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    use_scripted_engine(monkeypatch, gate)
    return server_config(**infer_options)


@pytest.fixture
def base(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/"


@pytest.mark.parametrize("gate", [EngineGate()])
async def test_health_is_503_while_loading_then_200(base: str, gate: EngineGate, caplog: pytest.LogCaptureFixture) -> None:
    async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        loading = await http.get("health")
        assert loading.status_code == 503 and loading.json() == {"status": "loading"}
        # A probe polling while a model loads is no error: the server's log says none (jupyter_server
        # logs every other 5xx as one, with the request's headers).
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "/health" in r.getMessage()]
        gate.open()
        for _ in range(200):
            ready = await http.get("health")
            if ready.status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert ready.status_code == 200 and ready.json() == {"status": "ok"}


async def test_health_needs_auth_by_default(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as anonymous:
        assert (await anonymous.get("health")).status_code == 403
        assert (await anonymous.get("health", headers={"Authorization": "token nope"})).status_code == 403

        # The engine loads in the background (on a busy machine, after the first probe).
        async def up() -> bool:
            return (await anonymous.get("health", headers=AUTH)).status_code == 200
        await eventually(up, timeout=30)


@pytest.mark.parametrize("infer_options", [{"health_without_auth": True}])
async def test_health_can_be_opened_to_probes(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as anonymous:
        # The engine loads in the background: a probe without a token sees it come up.
        async def up() -> bool:
            return (await anonymous.get("health")).json() == {"status": "ok"}
        await eventually(up, timeout=30)
        # Only health: everything else still needs the token.
        assert (await anonymous.get("status")).status_code == 403


async def test_tokenize_and_detokenize_round_trip(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        text = "Continuous batching keeps the GPU busy."
        answer = (await http.post("tokenize", json={"prompt": text, "return_token_strs": True})).json()
        assert set(answer) == {"count", "max_model_len", "tokens", "token_strs"}
        assert answer["count"] == len(answer["tokens"]) > 3 and "".join(answer["token_strs"]) == text
        back = (await http.post("detokenize", json={"tokens": answer["tokens"]})).json()
        assert back == {"prompt": text}
        # The completion route counts the same tokens.
        done = (await http.post("v1/completions", json={"prompt": text, "max_tokens": 1})).json()
        assert done["usage"]["prompt_tokens"] == answer["count"]
        chat = (await http.post("tokenize", json={"messages": [{"role": "user", "content": "hi"}]})).json()
        assert chat["count"] > 1
        for path, body in [("detokenize", {"tokens": [10**9]}), ("detokenize", {"tokens": "x"}),
                           ("tokenize", {"prompt": 3})]:
            bad = await http.post(path, json=body)
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
