"""engine = "router" through the real server: a local simulated backend and an upstream one
(a scripted OpenAI-compatible server on loopback). Rules send requests where
docs/scale-out.md says, the route shows in answers, headers, metrics, records and events,
and a failing upstream falls back to the local backend."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from server_helpers import AUTH, TOKEN, parse_sse, service_of
from tornado.httpclient import HTTPClientError
from upstream_helpers import MODEL, ScriptedUpstream

pytestmark = pytest.mark.timeout(120)

LONG = "Explain how continuous batching works, in detail. " * 10  # about 125 tokens


@pytest.fixture
def upstream(jp_asyncio_loop: Any) -> Any:
    up = ScriptedUpstream(delay_s=0.005).start()
    yield up
    jp_asyncio_loop.run_until_complete(up.stop())


@pytest.fixture
def infer_options(upstream: ScriptedUpstream) -> dict[str, Any]:
    return {
        "engine": "router",
        "router_backends": {
            "local": {"engine": "simulated"},
            "cluster": {"engine": "openai", "upstream_url": upstream.url, "upstream_retries": 0},
        },
        "router_sensitive_patterns": [r"\bconfidential\b"],
        "router_complex_prompt_tokens": 100,
        "router_complex_max_tokens": 200,
        "router_fallback": {"cluster": "local"},
    }


async def generate(jp_fetch: Any, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    response = await jp_fetch("infer", "generate", method="POST", body=json.dumps(body))
    return json.loads(response.body), response.headers


async def test_rules_send_each_request_where_the_docs_say(jp_fetch: Any, upstream: ScriptedUpstream) -> None:
    quick, headers = await generate(jp_fetch, {"prompt": "What is a KV cache?", "max_tokens": 8})
    assert quick["route"] == "local" and headers["X-Route"] == "local"
    assert not upstream.bodies  # a short question never left this process
    big, headers = await generate(jp_fetch, {"prompt": LONG, "max_tokens": 4})
    assert (big["route"], headers["X-Route"], big["text"]) == ("cluster", "cluster", "w0 w1 w2 w3 ")
    assert big["usage"]["prompt_tokens"] == upstream.PROMPT_TOKENS  # the upstream's own count
    long_answer, _ = await generate(jp_fetch, {"prompt": "Write an essay.", "max_tokens": 200})
    assert long_answer["route"] == "cluster"
    secret, _ = await generate(jp_fetch, {"prompt": "Confidential: " + LONG, "max_tokens": 4})
    assert secret["route"] == "local"  # sensitive: stays here whatever its size
    named, _ = await generate(jp_fetch, {"prompt": "hi", "max_tokens": 2, "model": "cluster"})
    assert named["route"] == "cluster"
    assert len(upstream.bodies) == 3
    with pytest.raises(HTTPClientError) as caught:
        await generate(jp_fetch, {"prompt": "Confidential: hi", "model": "cluster"})
    assert caught.value.code == 400 and "must stay in this process" in json.loads(caught.value.response.body)["message"]


async def test_models_lists_every_backend_and_openai_routes_pick_by_model(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, upstream: ScriptedUpstream,
) -> None:
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)
    models = await api.models.list()
    assert {(m.id, m.model_extra["route"]) for m in models.data} == {("simulated", "local"), (MODEL, "cluster")}
    chat = await api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=3)
    assert chat.model == MODEL and chat.choices[0].message.content == "w0 w1 w2 "
    assert chat.model_extra["route"] == "cluster"
    assert upstream.bodies[-1]["messages"] == [{"role": "user", "content": "Hello"}]  # a chat upstream
    stream = await api.completions.create(model="simulated", prompt="Explain attention", max_tokens=5, stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text and not text.startswith("w0")
    with pytest.raises(openai.NotFoundError, match="not served here"):  # OpenAI's and vLLM's 404
        await api.completions.create(model="gpt-5", prompt="hi")
    await api.close()


async def test_streams_say_their_route_and_fallback_moves_a_failing_upstreams_request(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, upstream: ScriptedUpstream, jp_serverapp: Any,
) -> None:
    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url}"
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as client:
        ok = await client.post("infer/generate_stream", json={"prompt": LONG, "max_tokens": 3})
        assert ok.headers["X-Route"] == "cluster"
        events, _ = parse_sse(ok.text)
        assert [e.data for e in events if e.event == "token"] == ["w0 ", "w1 ", "w2 "]
        assert json.loads(next(e.data for e in events if e.event == "result"))["route"] == "cluster"

        upstream.fail_next, upstream.fail_status = 1, 500  # the cluster fails before any token
        moved = await client.post("infer/generate_stream", json={"prompt": LONG, "max_tokens": 3})
        events, _ = parse_sse(moved.text)
        result = json.loads(next(e.data for e in events if e.event == "result"))
        assert result["route"] == "local" and events[-1].event == "done"
        whole = await client.post("infer/generate", json={"prompt": LONG, "max_tokens": 3})
        assert whole.json()["route"] == "cluster"  # the next one goes back to the cluster

        await upstream.stop()  # the cluster goes away entirely
        down = await client.post("infer/generate", json={"prompt": LONG, "max_tokens": 3})
        assert down.status_code == 200 and down.headers["X-Route"] == "local"

        metrics = (await client.get("infer/metrics")).json()
        routes = metrics["routes"]
        assert routes["cluster"]["requests"]["ok"] == 2 and routes["cluster"]["requests"]["failed"] == 2
        assert routes["local"]["requests"]["ok"] == 2
        assert metrics["fallbacks"] == {"cluster->local": 2}
        assert metrics["requests"]["ok"] == 4  # the totals sum the routes

        status = (await client.get("infer/status")).json()
        assert status["engine"] == "router" and set(status["routes"]) == {"local", "cluster"}
        assert status["routes"]["cluster"]["upstream"]["reachable"] is False
        assert status["routes"]["cluster"]["state"] == "unreachable" and status["state"] == "ready"
        assert status["rule"]["order"] == ["model", "sensitivity", "complexity", "default"]

        batches = (await client.get("infer/batches")).json()
        sources = {(b["route"], b["source"]) for b in batches["batches"]}
        assert sources == {("cluster", "upstream"), ("local", "engine")}
        assert len({b["id"] for b in batches["batches"]}) == len(batches["batches"])  # one id space
        assert {r["route"] for r in batches["requests"]} == {"cluster", "local"}
    service = service_of(jp_serverapp)
    assert type(service).__name__ == "RouterService"


async def test_cancel_reaches_the_backend_that_holds_the_request(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, upstream: ScriptedUpstream,
) -> None:
    from server_helpers import eventually

    upstream.delay_s = 0.05
    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url}"
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as client:
        async with client.stream("POST", "infer/generate_stream", json={"prompt": LONG, "max_tokens": 400}) as r:
            request_id = r.headers["X-Request-Id"]
            async for line in r.aiter_lines():
                if line.startswith("event: token"):
                    break
            deleted = await client.delete(f"infer/requests/{request_id}")
            assert deleted.status_code == 200
            await eventually(lambda: upstream.disconnects == 1 and upstream.open_streams == 0, timeout=5)
        metrics = (await client.get("infer/metrics")).json()
        assert metrics["routes"]["cluster"]["requests"]["cancelled"] == 1


async def test_prometheus_metrics_answer_behind_a_router(jp_fetch: Any) -> None:
    """/metrics reads the service's gauges at each scrape; a router's too (it has no prefix
    cache of its own: its backends' are in infer/metrics under routes)."""
    await generate(jp_fetch, {"prompt": "hi", "max_tokens": 2})
    text = (await jp_fetch("metrics")).body.decode()
    assert "jupyter_infer_queue_depth 0.0" in text and "jupyter_infer_running_requests 0.0" in text


async def test_constraints_follow_the_route(jp_fetch: Any, upstream: ScriptedUpstream) -> None:
    """A constrained request routed here is enforced here; routed to the cluster, its
    constraint goes upstream as a field (the upstream enforces it its own way)."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    here, _ = await generate(jp_fetch, {"prompt": "Is it?", "json_schema": schema, "max_tokens": 20})
    assert here["route"] == "local" and json.loads(here["text"]) in ({"ok": True}, {"ok": False})
    there, _ = await generate(jp_fetch, {"prompt": "Is it?", "json_schema": schema, "max_tokens": 4,
                                         "model": "cluster"})
    assert there["route"] == "cluster"
    assert upstream.bodies[-1]["response_format"]["json_schema"]["schema"] == schema
