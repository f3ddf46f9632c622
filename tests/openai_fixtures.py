"""Fixtures for tests that call the OpenAI routes of the test's server: its base URL, the
official client and a plain HTTP client, each with the Jupyter token as the API key.
A plugin of the suite (``conftest.py``): any test module may use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_helpers import AUTH, TOKEN


@pytest.fixture
def base_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1"


@pytest.fixture
def client(base_url: str, jp_asyncio_loop: Any) -> Any:
    """The official client, with the Jupyter token as its API key."""
    api = openai.AsyncOpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=60)
    yield api
    jp_asyncio_loop.run_until_complete(api.close())


@pytest.fixture
def http(base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


def engine_options(engine: str, model_dir: Path, **hf: Any) -> dict[str, Any]:
    """``infer_options`` for a test run on ``engine``: the simulated one as configured by
    default, or hf on the locally built tiny model (``hf``: more of its options)."""
    if engine == "hf":
        return {"engine": "hf", "model": str(model_dir), "dtype": "float32", "num_threads": 1, **hf}
    return {}
