"""Many users on one server: each request's owner, fair share between users, what each may see
and cancel, and the per-user limits, through the real server with an identity provider that
names users by their tokens (as JupyterHub's does; tests/server/test_hub_service.py runs the hub)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from jupyter_server.auth import IdentityProvider, User
from server_helpers import parse_sse, server_config, service_of, use_scripted_engine

TOKENS = {"alice-token": "alice", "bob-token": "bob", "teacher-token": "teacher"}


class TokenUsers(IdentityProvider):
    """Each token is one user (JupyterHub gives every user a token of their own)."""

    async def get_user(self, handler: Any) -> User | None:
        header = handler.request.headers.get("Authorization", "")
        token = header.split(" ", 1)[1] if " " in header else handler.get_argument("token", "")
        name = TOKENS.get(token)
        if name is None:
            return None
        handler._token_authenticated = True  # a token, not a cookie: no XSRF proof needed
        return User(name)


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"token {user}-token"}


@pytest.fixture
def infer_options() -> dict[str, Any]:
    return {"simulated_token_delay_ms": [2.0, 2.0], "max_batch_size": 2, "admin_users": ["teacher"]}


@pytest.fixture
def jp_server_config(infer_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    use_scripted_engine(monkeypatch)
    config = server_config(**infer_options)
    config["ServerApp"]["identity_provider_class"] = TokenUsers
    return config


@pytest.fixture
def http(jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}", timeout=30)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


async def generate(http: Any, user: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    response = await http.post("infer/generate", json={"prompt": prompt, "max_tokens": max_tokens}, headers=auth(user))
    assert response.status_code == 200, response.text
    return response.json()


async def running(jp_serverapp: Any, n: int) -> None:
    service = service_of(jp_serverapp)
    for _ in range(400):
        if service.num_running >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the requests never ran")


async def test_each_request_is_owned_by_its_user_and_others_see_it_only_as_anonymous(http: Any) -> None:
    mine = await generate(http, "alice", "What is attention in transformers?", 6)
    views = {u: (await http.get("infer/batches", headers=auth(u))).json() for u in ("alice", "bob", "teacher")}
    alice_view = next(r for r in views["alice"]["requests"] if r["id"] == mine["id"])
    assert alice_view["owner"] == "alice" and "anonymous" not in alice_view
    assert any(r["id"] == mine["id"] for r in views["teacher"]["requests"])  # an admin sees all
    bob_view = json.dumps(views["bob"])
    assert mine["id"] not in bob_view and "alice" not in bob_view
    anonymous = [r for r in views["bob"]["requests"] if r.get("anonymous")]
    assert len(anonymous) == 1 and anonymous[0]["owner"] == "another user"
    assert anonymous[0]["completion_tokens"] == 6  # the timeline still has its row
    batch = next(b for b in views["bob"]["batches"] if b["id"] == mine["batch"]["id"])
    assert batch["members"] == [anonymous[0]["id"]] and batch["owners"] == ["another user"]


async def test_another_users_request_cannot_be_cancelled_or_found(http: Any, jp_serverapp: Any) -> None:
    long = asyncio.create_task(generate(http, "alice", "Explain the KV cache", 400))
    await running(jp_serverapp, 1)
    request_id = service_of(jp_serverapp).batches()["running"][0]
    refused = await http.delete(f"infer/requests/{request_id}", headers=auth("bob"))
    assert refused.status_code == 404 and "No queued or running request" in refused.json()["message"]
    anonymous = (await http.get("infer/batches", headers=auth("bob"))).json()["running"][0]
    assert anonymous.startswith("anon-")
    assert (await http.delete(f"infer/requests/{anonymous}", headers=auth("bob"))).status_code == 404
    assert (await http.delete(f"infer/requests/{anonymous}", headers=auth("alice"))).status_code == 404
    assert not long.done()
    assert (await http.delete(f"infer/requests/{request_id}", headers=auth("alice"))).status_code == 200
    assert (await long)["finish_reason"] == "cancelled"


async def test_the_teacher_may_cancel_anyones_request(http: Any, jp_serverapp: Any) -> None:
    long = asyncio.create_task(generate(http, "bob", "Explain the KV cache", 400))
    await running(jp_serverapp, 1)
    request_id = service_of(jp_serverapp).batches()["running"][0]
    assert (await http.delete(f"infer/requests/{request_id}", headers=auth("teacher"))).status_code == 200
    assert (await long)["finish_reason"] == "cancelled"


async def test_live_events_show_others_requests_without_their_ids_or_text(http: Any, jp_serverapp: Any) -> None:
    async def watch(user: str, into: list[str]) -> None:
        async with http.stream("GET", "infer/events", headers=auth(user)) as stream:
            async for chunk in stream.aiter_text():
                into.append(chunk)

    seen: dict[str, list[str]] = {"alice": [], "bob": []}
    watchers = [asyncio.create_task(watch(u, seen[u])) for u in seen]
    await asyncio.sleep(0.3)
    answer = await generate(http, "alice", "SHORT", 8)
    await asyncio.sleep(0.3)
    for task in watchers:
        task.cancel()
    alice_events = [e for e in parse_sse("".join(seen["alice"]))[0] if e.event != "message"]
    bob_text = "".join(seen["bob"])
    assert answer["id"] in "".join(seen["alice"]) and "three" in "".join(seen["alice"])
    assert any(e.event == "finished" for e in alice_events)
    bob_events = [json.loads(e.data) for e in parse_sse(bob_text)[0] if e.event in ("queued", "finished", "token")]
    assert bob_events and all(e["id"].startswith("anon-") and e["owner"] == "another user" for e in bob_events)
    assert answer["id"] not in bob_text and "alice" not in bob_text and "three" not in bob_text


async def test_metrics_count_per_user_and_show_each_user_only_their_own(http: Any) -> None:
    await generate(http, "alice", "hello", 3)
    await generate(http, "bob", "hello", 2)
    bob = (await http.get("infer/metrics", headers=auth("bob"))).json()
    teacher = (await http.get("infer/metrics", headers=auth("teacher"))).json()
    assert set(bob["owners"]) == {"bob"} and bob["owners"]["bob"]["completion_tokens"] == 2
    assert teacher["owners"]["alice"]["ok"] == 1 and teacher["owners"]["bob"]["ok"] == 1
    assert bob["requests"]["ok"] == 2  # the totals name nobody
    prometheus = (await http.get("metrics", headers=auth("teacher"))).text
    assert 'jupyter_infer_owner_requests_total{outcome="ok",owner="alice"}' in prometheus
    assert 'jupyter_infer_owner_tokens_total{kind="completion",owner="bob"}' in prometheus
    assert "hello" not in prometheus


async def test_a_user_with_one_request_does_not_wait_for_anothers_burst(http: Any, jp_serverapp: Any) -> None:
    burst = [asyncio.create_task(generate(http, "alice", f"burst {i}", 60)) for i in range(6)]
    await running(jp_serverapp, 2)
    mine = await generate(http, "bob", "hello", 4)
    done = sum(task.done() for task in burst)
    results = await asyncio.gather(*burst)
    assert done == 0  # bob's answer came while the first of alice's was still running
    assert mine["timings"]["queued_ms"] < min(r["timings"]["total_ms"] for r in results)
    assert service_of(jp_serverapp).metrics()["parked_rows"] >= 1


@pytest.mark.parametrize("infer_options", [{"fair_share": False, "max_batch_size": 2,
                                            "simulated_token_delay_ms": [2.0, 2.0]}])
async def test_without_fair_share_the_burst_goes_first(http: Any, jp_serverapp: Any) -> None:
    burst = [asyncio.create_task(generate(http, "alice", f"burst {i}", 30)) for i in range(4)]
    await running(jp_serverapp, 2)
    await generate(http, "bob", "hello", 4)
    assert sum(task.done() for task in burst) >= 2  # bob waited for a row of alice's to free
    await asyncio.gather(*burst)


@pytest.mark.parametrize("infer_options", [{"owner_max_queued": 1, "max_batch_size": 1,
                                            "simulated_token_delay_ms": [2.0, 2.0]}])
async def test_a_users_queue_limit_refuses_them_with_429_and_not_others(http: Any, jp_serverapp: Any) -> None:
    first = asyncio.create_task(generate(http, "alice", "one", 200))
    await running(jp_serverapp, 1)
    second = asyncio.create_task(generate(http, "alice", "two", 5))
    for _ in range(200):
        if service_of(jp_serverapp).queue_depth:
            break
        await asyncio.sleep(0.005)
    refused = await http.post("infer/generate", json={"prompt": "three", "max_tokens": 5}, headers=auth("alice"))
    assert refused.status_code == 429 and "owner_max_queued" in refused.json()["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert (await generate(http, "bob", "hi", 2))["finish_reason"] == "length"
    for task in (first, second):
        await task


@pytest.mark.parametrize("infer_options", [{"owner_tokens_per_minute": 60}])
async def test_a_users_token_budget_refuses_them_with_429_and_retry_after(http: Any) -> None:
    await generate(http, "alice", "hello", 30)
    over = await http.post("infer/v1/completions", json={"prompt": "hello", "max_tokens": 40}, headers=auth("alice"))
    assert over.status_code == 429
    assert "owner_tokens_per_minute" in over.json()["error"]["message"] and int(over.headers["Retry-After"]) >= 1
    too_big = await http.post("infer/generate", json={"prompt": "hello", "max_tokens": 100}, headers=auth("bob"))
    assert too_big.status_code == 429 and "more than the 60 tokens per minute" in too_big.json()["message"]
    assert (await generate(http, "bob", "hello", 20))["usage"]["completion_tokens"] == 20


def test_a_users_server_on_the_hub_sends_its_requests_to_the_shared_service() -> None:
    from jupyter_infer.server.app import InferApp, hub_shared_service

    hub_user = {"JUPYTER_INFER_URL": "http://hub.example/services/infer", "JUPYTERHUB_API_TOKEN": "t"}
    assert hub_shared_service(hub_user) == {
        "engine": "openai", "upstream_url": "http://hub.example/services/infer/infer/v1",
        "upstream_api_key_env": "JUPYTERHUB_API_TOKEN"}
    assert hub_shared_service({**hub_user, "JUPYTERHUB_SERVICE_NAME": "infer"}) == {}  # the service itself
    assert hub_shared_service({"JUPYTER_INFER_URL": "http://x/"}) == {}  # not on a hub
    import os
    from unittest import mock

    from traitlets.config import Config

    with mock.patch.dict(os.environ, hub_user):
        assert InferApp().service_config().engine == "openai"
        app = InferApp(config=Config({"InferApp": {"engine": "simulated"}}))  # the admin's own choice wins
        assert app.service_config().engine == "simulated"


async def test_an_eventsource_reconnecting_with_another_users_id_learns_nothing(http: Any) -> None:
    mine = await generate(http, "alice", "hello", 2)
    again = await http.get("infer/generate_stream", params={"prompt": "hi", "max_tokens": 2},
                           headers={**auth("alice"), "Last-Event-ID": mine["id"]})
    assert again.status_code == 204  # her own stream's end: the EventSource stops
    other = await http.get("infer/generate_stream", params={"prompt": "hi", "max_tokens": 2},
                           headers={**auth("bob"), "Last-Event-ID": mine["id"]})
    assert other.status_code == 200 and "event: done" in other.text  # as for an id nobody knows


def test_the_viewer_hides_others_in_every_event_kind_and_in_a_routers_backends() -> None:
    from jupyter_infer.server.viewer import Viewer, anonymous_id

    bob = Viewer("bob")
    step = {"type": "step", "members": ["r1", "r2"], "owners": ["alice", "bob"], "tokens": 2}
    assert bob.event(step)["members"] == [anonymous_id("r1"), "r2"]
    assert bob.event(step)["owners"] == ["another user", "bob"]
    token = bob.event({"type": "token", "id": "r1", "owner": "alice", "index": 3, "text": "secret"})
    assert token == {"type": "token", "id": anonymous_id("r1"), "owner": "another user", "index": 3}
    finished = bob.event({"type": "finished", "id": "r1", "owner": "alice", "error": "alice's prompt was...",
                          "outcome": "failed"})
    assert "error" not in finished and finished["outcome"] == "failed"
    assert bob.event({"type": "queued", "id": "r2", "owner": "bob"})["id"] == "r2"
    metrics = {"owners": {"alice": {"ok": 1}, "bob": {"ok": 2}},
               "routes": {"local": {"owners": {"alice": {"ok": 1}}}}}
    seen = bob.metrics(metrics)
    assert seen["owners"] == {"bob": {"ok": 2}} and seen["routes"]["local"]["owners"] == {}
    assert Viewer("teacher", sees_all=True).metrics(metrics) is metrics
    assert anonymous_id("r1") == anonymous_id("r1") != anonymous_id("r2")


async def test_only_an_admin_may_load_or_unload_the_model_everyone_uses(http: Any) -> None:
    for method in ("POST", "DELETE"):
        refused = await http.request(method, "infer/models", json={"model": "simulated"} if method == "POST" else None,
                                     headers=auth("bob"))
        assert refused.status_code == 403 and "only an admin may" in refused.json()["message"], refused.text
    assert (await http.get("infer/models", headers=auth("bob"))).status_code == 200  # the list is readable
    loaded = await http.post("infer/models", json={"model": "simulated"}, headers=auth("teacher"))
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
