"""Several models resident at once (``max_loaded_models``): a chat model, an embedder and a
coder side by side, each served by its own engine and scheduler; past the bound, or where a
model would not fit in memory, the least recently used side model goes; a model that fits in
no way is refused with the bytes it needs."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import AUTH, server_config

from jupyter_infer.service import residents

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def shelf(tmp_path: Path, tiny_model_dir: Path, embed_model_dir: Path, coder_model_dir: Path) -> Path:
    """A folder of three models, as a user's ~/models."""
    folder = tmp_path / "models"
    for model in (tiny_model_dir, embed_model_dir, coder_model_dir):
        shutil.copytree(model, folder / model.name)
    return folder


@pytest.fixture
def infer_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"max_loaded_models": getattr(request, "param", 3)}


@pytest.fixture
def jp_server_config(shelf: Path, infer_options: dict[str, Any]) -> dict[str, Any]:
    return server_config(engine="hf", model=str(shelf / "tiny"), load_on_demand=True, model_dirs=[str(shelf)],
                         dtype="float32", num_threads=1, max_new_tokens=16, **infer_options)


@pytest.fixture
def http(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/", headers=AUTH,
                               timeout=120)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_a_chat_model_an_embedder_and_a_coder_serve_side_by_side(http: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(
        http.post("v1/chat/completions", json=chat("tiny")),
        http.post("v1/embeddings", json={"model": "embed-tiny", "input": ["a kv cache", "tokens"]}),
        http.post("v1/completions", json={"model": "coder-tiny", "prompt": "def f(", "suffix": "):\n", "max_tokens": 4}),
    )
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert len(answers[1].json()["data"]) == 2 and answers[2].json()["choices"][0]["text"] is not None
    models = (await http.get("models")).json()
    resident = {Path(r["path"]).name: r for r in models["resident"]}
    assert set(resident) == {"embed-tiny", "coder-tiny"} and all(r["state"] == "ready" for r in resident.values())
    assert all(r["bytes"] > 0 for r in resident.values()) and models["max_loaded_models"] == 3
    loaded = {Path(m["path"]).name for m in models["models"] if m["loaded"]}
    assert loaded == {"tiny", "embed-tiny", "coder-tiny"} and models["switches"] == 0  # nothing switched
    # Each keeps its own: the chat model still answers chats, the embedder refuses them.
    refused = await http.post("v1/chat/completions", json=chat("embed-tiny"))
    assert refused.status_code == 400 and "embedding model" in refused.json()["error"]["message"]
    status = (await http.get("status")).json()
    assert Path(status["model"]).name == "tiny" and len(status["resident"]) == 2


@pytest.mark.parametrize("infer_options", [2], indirect=True)
async def test_past_the_bound_the_least_recently_used_side_model_goes(http: httpx.AsyncClient) -> None:
    assert (await http.post("v1/embeddings", json={"model": "embed-tiny", "input": "a"})).status_code == 200
    coder = await http.post("v1/completions", json={"model": "coder-tiny", "prompt": "x = ", "max_tokens": 2})
    assert coder.status_code == 200
    resident = [Path(r["path"]).name for r in (await http.get("models")).json()["resident"]]
    assert resident == ["coder-tiny"]  # the embedder made room; the configured model stays
    again = await http.post("v1/embeddings", json={"model": "embed-tiny", "input": "a"})
    assert again.status_code == 200  # it comes back, in the coder's place
    assert [Path(r["path"]).name for r in (await http.get("models")).json()["resident"]] == ["embed-tiny"]


async def test_a_model_that_cannot_fit_is_refused_with_the_bytes(http: httpx.AsyncClient,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(residents, "available_bytes", lambda: 1000)
    refused = await http.post("v1/embeddings", json={"model": "embed-tiny", "input": "a"})
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "needs about" in message and "available" in message and "quantize" in message
    assert (await http.get("models")).json()["resident"] == []
    assert (await http.post("v1/chat/completions", json=chat("tiny"))).status_code == 200  # the loaded one serves on
