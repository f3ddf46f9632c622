"""A model under ``InferApp.model_dirs`` is named as the listing names it, everywhere a person
reads or types a name: ``serve --model small`` starts it (it was refused: "small is not in the
Hugging Face cache … hf download small", while ``%infer_model small`` and the panel loaded it),
and v1/models, answers and infer/status say ``small``, its path beside it, not the absolute path
that lists and the panel cut to ``Model /home/…/models/…``. ``max_model_len`` caps the context
a request may hold, as vLLM's ``--max-model-len`` and llama-server's ``-c`` do."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import AUTH, server_config, service_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shelf(tmp_path: Path, tiny_model_dir: Path) -> Path:
    folder = tmp_path / "models"
    shutil.copytree(tiny_model_dir, folder / "team" / "small")
    return folder


@pytest.fixture
def jp_server_config(shelf: Path) -> dict[str, Any]:
    return server_config(engine="hf", model="team/small", model_dirs=[str(shelf)], dtype="float32", num_threads=1,
                         max_model_len=64)


@pytest.fixture
def http(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/", headers=AUTH,
                               timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


async def test_a_model_named_as_listed_is_served_and_shown_by_that_name(http: httpx.AsyncClient, shelf: Path,
                                                                        jp_serverapp: Any) -> None:

    await service_of(jp_serverapp).wait_ready(60)
    status = (await http.get("status")).json()
    assert (status["state"], status["engine"]) == ("ready", "hf"), status.get("load_error")
    assert status["model"] == "team/small" and status["model_path"] == str(shelf / "team" / "small")
    card = (await http.get("v1/models")).json()["data"][0]
    assert (card["id"], card["root"], card["max_model_len"]) == ("team/small", str(shelf / "team" / "small"), 64)
    listed = (await http.get("models")).json()["models"]
    assert [(m["id"], m["loaded"]) for m in listed if m["source"] == "folder"] == [("team/small", True)]
    for name in ("team/small", "small"):
        answer = await http.post("v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["model"] == "team/small", answer.text
    # The context is max_model_len's 64 tokens, not the checkpoint's own.
    too_long = await http.post("v1/completions", json={"model": "small", "prompt": "hello " * 40, "max_tokens": 30})
    assert too_long.status_code == 400 and "maximum context length is 64 tokens" in too_long.json()["error"]["message"]
