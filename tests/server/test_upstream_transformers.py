"""engine = "openai" in front of a real third-party OpenAI server: ``transformers serve
--continuous-batching`` on a locally built model, behind a counting TCP proxy.

``transformers serve`` needs transformers' ``[serving]`` extra (FastAPI, uvicorn, ...): the
project's test extra has it (the bench's peer is the same command), so the test runs the
``transformers`` command of the environment it runs in (a second environment built at test time
cost this module ~3 minutes of its setup on a fresh clone).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import openai
import pytest
from nbclient import NotebookClient
from server_helpers import AUTH, TOKEN, eventually, parse_sse, stop_process
from upstream_helpers import CountingProxy, free_port, wait_for_http

from jupyter_infer.cpu.child_process import dies_with_parent
from jupyter_infer.kernel.launcher import LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]



def transformers_command() -> str:
    """The ``transformers`` command beside this Python (the project's test extra installs it)."""
    command = Path(sys.executable).parent / "transformers"
    assert command.exists(), "pip install -e '.[test]' (transformers[serving]) installs the transformers command"
    return str(command)


@pytest.fixture(scope="module")
def transformers_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``transformers serve`` on the tiny model; yields its base URL (``.../v1``), warmed up."""
    command = transformers_command()
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [command, "serve", str(tiny_model_dir), "--continuous-batching",
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=dies_with_parent(),
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        asyncio.run(wait_for_http(f"{url}/models", timeout=180))
        # The first generation sets up its continuous-batching manager (slow on a busy CPU).
        httpx.post(f"{url}/completions", json={"model": str(tiny_model_dir), "prompt": "warm", "max_tokens": 2},
                   timeout=300).raise_for_status()
        yield url
    except BaseException:
        print(log.read_text()[-3000:])
        raise
    finally:
        stop_process(proc, 20)


@pytest.fixture
def proxy(transformers_server: str, jp_asyncio_loop: Any) -> Iterator[CountingProxy]:
    port = int(transformers_server.rsplit(":", 1)[1].split("/")[0])
    counting = jp_asyncio_loop.run_until_complete(CountingProxy(port).start())
    yield counting
    jp_asyncio_loop.run_until_complete(counting.stop())


@pytest.fixture
def infer_options(proxy: CountingProxy) -> dict[str, Any]:
    return {"engine": "openai", "upstream_url": proxy.url, "upstream_timeout_s": 120.0, "max_batch_size": 8}


@pytest.fixture
def front(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Iterator[httpx.AsyncClient]:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}", headers=AUTH, timeout=300)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


async def test_json_sse_and_openai_routes_work_through_the_front(
    front: httpx.AsyncClient, tiny_model_dir: Path, jp_http_port: int, jp_base_url: str,
) -> None:
    await front.get("infer/v1/models")  # answers once the front has looked at the upstream
    status = (await front.get("infer/status")).json()
    assert status["engine"] == "openai" and status["model"] == str(tiny_model_dir)
    assert status["upstream"]["reachable"] is True

    whole = (await front.post("infer/generate", json={"prompt": "Hello there", "max_tokens": 6})).json()
    assert whole["usage"]["completion_tokens"] == 6 and whole["finish_reason"] == "length"
    assert whole["usage"]["prompt_tokens"] > 0 and whole["timings"]["ttft_ms"] > 0

    sse = await front.post("infer/generate_stream", json={"prompt": "Once upon", "max_tokens": 5})
    events, _ = parse_sse(sse.text)
    kinds = [e.event for e in events]
    assert kinds.count("token") >= 1 and kinds[-2:] == ["result", "done"]
    result = json.loads(events[-2].data)
    assert "".join(e.data for e in events if e.event == "token") == result["text"]

    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0, timeout=300)
    assert [m.id for m in (await api.models.list()).data] == [str(tiny_model_dir)]
    completion = await api.completions.create(model=str(tiny_model_dir), prompt="The cat", max_tokens=4)
    assert completion.usage.completion_tokens == 4
    chunks = [c async for c in await api.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True})]
    assert chunks[-1].usage.completion_tokens == 4
    await api.close()


async def test_eight_concurrent_requests_are_in_flight_together(front: httpx.AsyncClient, proxy: CountingProxy) -> None:
    before = proxy.total
    prompts = [f"Request number {i} says" for i in range(8)]
    answers = await asyncio.gather(*(
        front.post("infer/generate", json={"prompt": p, "max_tokens": 12}) for p in prompts))
    assert [a.status_code for a in answers] == [200] * 8
    assert all(a.json()["usage"]["completion_tokens"] == 12 for a in answers)
    assert proxy.total - before >= 1  # they went upstream (over pooled connections)
    batches = (await front.get("infer/batches")).json()
    spans = batches["batches"]
    assert batches["source"] == "upstream" and all(b["source"] == "upstream" for b in spans)
    assert max(b["size"] for b in spans) >= 4  # the front kept several in flight at once
    ids = {a.json()["id"] for a in answers}
    assert ids <= {m for b in spans for m in b["members"]}


async def test_a_client_disconnect_closes_the_upstream_request(front: httpx.AsyncClient, proxy: CountingProxy) -> None:
    closed_before = proxy.closed_by_client
    async with front.stream("POST", "infer/generate_stream",
                            json={"prompt": "Tell me a long story", "max_tokens": 480}) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: token"):
                break  # one token in, the client leaves
    # The front closes its upstream connection: the proxy sees our side hang up.
    await eventually(lambda: proxy.closed_by_client == closed_before + 1, timeout=5)
    metrics = (await front.get("infer/metrics")).json()
    assert metrics["requests"]["cancelled"] == 1 and metrics["requests"]["running"] == 0


def test_a_notebook_with_the_magics_works_through_the_front(transformers_server: str, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext jupyter_infer",
        "%%infer --max-tokens 6\nHello from a notebook",
        "%infer --no-stream --max-tokens 4 What comes next",
        "%infer_status",
        "%infer_burst 4 --max-tokens 6",
    )]
    with LocalServer(engine="openai", upstream_url=transformers_server, upstream_timeout_s=120.0) as server:
        env = {**os.environ, "JUPYTER_INFER_URL": server.url, "JUPYTER_INFER_TOKEN": server.token}
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
        metrics = server.get("infer/metrics")
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    streamed = str(nb.cells[1].outputs[-1].get("data", {}).get("text/plain", ""))
    assert "6 tokens" in streamed
    status_text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in nb.cells[3].outputs)
    assert "openai" in status_text
    assert metrics["requests"]["ok"] == 6 and metrics["requests"]["failed"] == 0, metrics["requests"]


def test_the_magics_work_against_the_plain_server_with_no_jupyter_server_between(
    transformers_server: str, tmp_path: Path,
) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext jupyter_infer",
        "%%infer --max-tokens 5\nHello straight to the model server",
        "%infer_burst 4 --max-tokens 6",
        "%infer_status",
        "from jupyter_infer.kernel.client import default_client\n"
        "b = default_client().batches()\n"
        "print(b['timings'], sorted({x['source'] for x in b['batches']}), max(x['size'] for x in b['batches']))",
    )]
    env = {**os.environ, "JUPYTER_INFER_URL": transformers_server}
    env.pop("JUPYTER_INFER_TOKEN", None)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors

    def text(i: int) -> str:
        return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in nb.cells[i].outputs)

    assert "5 tokens" in text(1)
    assert "4 requests (4 ok" in text(2)
    assert "OpenAI-compatible server" in text(3) and "client-side" in text(3)
    assert text(4).split()[:2] == ["client-side", "['upstream']"]
