"""The JSON routes of the server extension, through pytest-jupyter's in-process server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest
from server_helpers import AUTH, POISON, eventually, parse_sse, service_of
from tornado.httpclient import HTTPClientError

from jupyter_infer.server.app import InferApp
from jupyter_infer.server.handlers import routes
from jupyter_infer.values.config import ServiceConfig

ROUTES = [
    ("POST", "infer/generate"),
    ("POST", "infer/generate_stream"),
    ("GET", "infer/generate_stream?prompt=hi"),
    ("GET", "infer/status"),
    ("GET", "infer/metrics"),
    ("GET", "infer/batches"),
    ("GET", "infer/events"),
    ("POST", "infer/v1/completions"),
    ("POST", "infer/v1/chat/completions"),
    ("GET", "infer/v1/models"),
    ("GET", "infer/v1/models/simulated"),
    ("GET", "infer/v1/embeddings"),
    ("GET", "infer/health"),
    ("POST", "infer/tokenize"),
    ("POST", "infer/detokenize"),
    ("GET", "infer/tokenizer_info"),
]


async def post(jp_fetch: Any, path: str, body: Any, **kwargs: Any) -> Any:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return await jp_fetch(*path.split("/"), method="POST", body=data, **kwargs)


async def post_json(jp_fetch: Any, path: str, body: Any) -> dict[str, Any]:
    return json.loads((await post(jp_fetch, path, body)).body)


async def error_of(jp_fetch: Any, path: str, body: Any) -> tuple[int, dict[str, Any], Any]:
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, path, body)
    response = info.value.response
    return info.value.code, json.loads(response.body), response.headers


# -- auth -------------------------------------------------------------------------------------
def test_every_verb_is_authenticated_and_authorized() -> None:
    from jupyter_server.serverapp import ServerWebApplication

    for pattern, handler in routes():
        assert ServerWebApplication._check_handler_auth(None, pattern, handler) == [], pattern
        assert handler.auth_resource == "jupyter_infer"


async def test_every_route_refuses_requests_without_credentials(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str
) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}") as client:
        for method, path in ROUTES:
            # OpenAI's clients understand 401 (AuthenticationError), and a POST without a token
            # is told to send one (not "'_xsrf' argument missing"); a GET is jupyter_server's 403.
            openai = path.startswith("infer/v1/") or path in ("infer/tokenize", "infer/detokenize")
            refused = 401 if openai or method == "POST" else 403
            response = await client.request(method, path, json={"prompt": "hi"} if method == "POST" else None)
            assert response.status_code == refused, (method, path)
            assert "token" in response.text.lower() or "api key" in response.text.lower(), (method, path)
            wrong = await client.request(method, path, headers={"Authorization": "token nope"})
            assert wrong.status_code == refused, (method, path)
        # The same routes answer with the token (the streams are covered elsewhere).
        ok = await client.get("infer/status", headers=AUTH)
        assert ok.status_code == 200
        # An unknown path is a JSON 404, not a redirect to the login page (on which lm-eval's
        # probe for vLLM's infer/tokenizer_info choked) nor HTML.
        for method in ("GET", "POST", "DELETE"):
            missing = await client.request(method, "infer/tokenizer_info", headers=AUTH)
            assert missing.status_code == 404 and "No route" in missing.json()["message"]



@pytest.mark.parametrize(("path", "body"), [
    ("infer/generate", {"prompt": "hi", "max_tokens": 2}),
    ("infer/generate_stream", {"prompt": "hi", "max_tokens": 2}),
    ("infer/v1/completions", {"prompt": ["hi", "there"], "n": 2, "max_tokens": 2}),
    ("infer/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
])
async def test_on_a_single_user_server_every_request_has_one_owner(
    jp_fetch: Any, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    # jupyter_server names each token-only request with a fresh random user; they are all the
    # one user of this server (fair share and the views go by it), and they see everything.
    service = service_of(jp_serverapp)
    owners: list[str] = []
    submit = service.submit

    async def spy(request: Any) -> Any:
        owners.append(request.owner)
        return await submit(request)

    monkeypatch.setattr(service, "submit", spy)
    for _ in range(2):
        response = await post(jp_fetch, path, body)
        assert response.code == 200
    assert owners == ["local"] * (8 if "n" in body else 2)
    batches = json.loads((await jp_fetch("infer", "batches", params={"limit": 5})).body)
    assert not any(r.get("anonymous") for r in batches["requests"])


def test_the_owner_is_the_user_name_whatever_its_type() -> None:
    from jupyter_server.auth import User

    from jupyter_infer.server.viewer import user_name

    assert user_name(User("ada")) == "ada"
    assert user_name("grace") == "grace"  # an identity provider that gives the name as a string
    assert user_name(None) is None and user_name("") is None

# -- generate ---------------------------------------------------------------------------------
async def test_generate_answers_with_the_contract_shape(jp_fetch: Any) -> None:
    response = await post(jp_fetch, "infer/generate", {"prompt": "What is attention?", "max_tokens": 12})
    answer = json.loads(response.body)
    assert response.headers["X-Request-Id"] == answer["id"]
    assert set(answer) == {"id", "text", "finish_reason", "usage", "batch", "timings", "model"}
    assert answer["model"] == "simulated"  # which model wrote it (a cell says so when none did)
    assert answer["text"] and answer["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 12
    assert answer["usage"]["prompt_tokens"] > 0
    assert answer["batch"]["id"] >= 1 and answer["batch"]["size"] >= 1
    assert set(answer["timings"]) == {"queued_ms", "ttft_ms", "total_ms"}
    again = await post_json(jp_fetch, "infer/generate", {"prompt": "What is attention?", "max_tokens": 12})
    assert again["text"] == answer["text"]  # greedy by default: deterministic


async def test_generate_takes_the_sampling_extras(jp_fetch: Any) -> None:
    short = {"prompt": "SHORT answer", "max_tokens": 12}  # the scripted answer is shorter: EOS ends it
    plain = await post_json(jp_fetch, "infer/generate", short)
    assert plain["usage"]["completion_tokens"] < 12
    for extra in ({"ignore_eos": True}, {"min_tokens": 12}):
        answer = await post_json(jp_fetch, "infer/generate", {**short, **extra})
        assert answer["usage"]["completion_tokens"] == 12 and answer["text"].startswith(plain["text"])
    neutral = {"top_k": -1, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0,
               "logit_bias": {"1": 0}, "stop": [f"never{i}" for i in range(20)]}
    assert (await post_json(jp_fetch, "infer/generate", {**short, **neutral}))["text"] == plain["text"]
    nothing = await post_json(jp_fetch, "infer/generate", {**short, "max_tokens": 0})
    assert nothing["usage"]["completion_tokens"] == 0 and nothing["finish_reason"] == "length"
    streamed = await jp_fetch("infer", "generate_stream", params={**short, "ignore_eos": "true"})
    assert json.loads(parse_sse(streamed.body.decode())[0][-2].data)["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("infer_options", [{"mode": "window", "batch_window_ms": 300.0}])
async def test_concurrent_generate_calls_share_one_batch(jp_fetch: Any) -> None:
    prompts = ["attention", "batching", "KV cache", "sampling", "tokenizers"]
    answers = await asyncio.gather(*(
        post_json(jp_fetch, "infer/generate", {"prompt": p, "max_tokens": 5}) for p in prompts
    ))
    assert len({a["batch"]["id"] for a in answers}) == 1
    assert {a["batch"]["size"] for a in answers} == {len(prompts)}
    batches = json.loads((await jp_fetch("infer", "batches")).body)["batches"]
    assert sorted(batches[-1]["members"]) == sorted(a["id"] for a in answers)


@pytest.mark.parametrize("infer_options", [{"max_batch_size": 4, "mode": "window", "batch_window_ms": 200.0}])
async def test_max_batch_size_reaches_the_scheduler(jp_fetch: Any, jp_serverapp: Any) -> None:
    service = service_of(jp_serverapp)
    assert service.limits.max_batch_size == 4
    assert service.config.simulated_token_delay_ms == (0.0, 0.0)
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["limits"]["max_batch_size"] == 4 and status["mode"] == "window"
    answers = await asyncio.gather(*(
        post_json(jp_fetch, "infer/generate", {"prompt": f"prompt {i}", "max_tokens": 3}) for i in range(6)
    ))
    sizes = [a["batch"]["size"] for a in answers]
    assert max(sizes) == 4 and sorted(sizes) == [2, 2, 4, 4, 4, 4]
    batches = json.loads((await jp_fetch("infer", "batches")).body)["batches"]
    assert max(b["size"] for b in batches) == 4


@pytest.mark.parametrize("infer_options", [{"mode": "continuous", "max_batch_size": 4}])
async def test_continuous_batches_are_capped_too(jp_fetch: Any) -> None:
    await asyncio.gather(*(
        post_json(jp_fetch, "infer/generate", {"prompt": f"prompt {i}", "max_tokens": 8}) for i in range(10)
    ))
    batches = json.loads((await jp_fetch("infer", "batches", params={"limit": "1000"})).body)["batches"]
    assert batches and max(b["size"] for b in batches) <= 4


# -- bad input --------------------------------------------------------------------------------
BAD_INPUT = [
    ("{not json", 400, "not valid JSON"),
    ("", 400, "body is empty"),
    ([1, 2], 400, "must be a JSON object"),
    ({"prompt": 5}, 400, "'prompt' must be a string"),
    ({"prompt": "   "}, 400, "'prompt' is empty"),
    ({"prompt": "hi", "max_tokens": -1}, 400, "'max_tokens' must be an integer from 0"),
    ({"prompt": "hi", "max_tokens": "ten"}, 400, "'max_tokens' must be an integer from 0"),
    ({"prompt": "hi", "max_tokens": 40_000}, 400, "maximum context length is 32768"),
    ({"prompt": "hi", "temperature": 7}, 400, "'temperature' must be between"),
    ({"prompt": "hi", "top_p": 1.5}, 400, "'top_p' must be between"),
    ({"prompt": "hi", "repetition_penalty": -1}, 400, "'repetition_penalty' must be between"),
    ({"prompt": "hi", "stop": [1]}, 400, "'stop' must be"),
    ({"prompt": "hi", "colour": "red"}, 400, "Unknown field(s): colour"),
    ({"prompt": "word " * 40}, 400, "InferApp.max_prompt_tokens"),
    ({"prompt": "x" * 5000}, 413, "InferApp.max_body_bytes"),
]


@pytest.mark.parametrize("infer_options", [{"max_prompt_tokens": 32, "max_body_bytes": 4096}])
@pytest.mark.parametrize("path", ["infer/generate", "infer/generate_stream"])
async def test_bad_input_is_refused_and_nothing_is_queued(jp_fetch: Any, jp_serverapp: Any, path: str) -> None:
    service = service_of(jp_serverapp)
    for body, status, message in BAD_INPUT:
        code, error, _ = await error_of(jp_fetch, path, body)
        assert (code, message in error["message"]) == (status, True), (body, error)
    snapshot = service.metrics()
    assert snapshot["requests"]["rejected"] == len(BAD_INPUT)
    assert snapshot["requests"]["ok"] == snapshot["requests"]["failed"] == 0
    assert service.queue_depth == 0 and not service.batches()["requests"]
    # The server still answers.
    assert (await post_json(jp_fetch, "infer/generate", {"prompt": "still there?", "max_tokens": 3}))["text"]


async def test_bad_query_parameters_on_get_stream(jp_fetch: Any) -> None:
    for params, message in [
        ({"prompt": "hi", "max_tokens": "many"}, "'max_tokens' must be a number"),
        ({"prompt": "hi", "top_p": "2"}, "'top_p' must be between"),
        ({"max_tokens": "3"}, "'prompt' must be a string"),
        ({"prompt": "hi", "bogus": "1"}, "Unknown field(s): bogus"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("infer", "generate_stream", params=params)
        assert info.value.code == 400
        assert message in json.loads(info.value.response.body)["message"]


async def test_batches_limit_is_checked(jp_fetch: Any) -> None:
    for value in ("0", "x", "-1"):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("infer", "batches", params={"limit": value})
        assert info.value.code == 400
    for i in range(3):
        await post_json(jp_fetch, "infer/generate", {"prompt": f"p{i}", "max_tokens": 2})
    answer = json.loads((await jp_fetch("infer", "batches", params={"limit": "2", "requests": "1"})).body)
    assert len(answer["batches"]) == 2 and len(answer["requests"]) == 1
    assert {"id", "mode", "members", "started_at", "ended_at", "steps", "tokens", "size"} <= set(answer["batches"][0])
    assert {"id", "queued_at", "admitted_at", "finished_at", "batch_id", "outcome"} <= set(answer["requests"][0])


@pytest.mark.parametrize(
    "infer_options",
    [{"max_queue_size": 1, "max_batch_size": 1, "simulated_token_delay_ms": [15.0, 15.0]}],
)
async def test_full_queue_answers_429_with_retry_after(jp_fetch: Any, jp_serverapp: Any) -> None:
    service = service_of(jp_serverapp)
    first = asyncio.ensure_future(post_json(jp_fetch, "infer/generate", {"prompt": "one", "max_tokens": 20}))
    await eventually(lambda: service.num_running == 1)
    second = asyncio.ensure_future(post_json(jp_fetch, "infer/generate", {"prompt": "two", "max_tokens": 2}))
    await eventually(lambda: service.queue_depth == 1)
    code, error, headers = await error_of(jp_fetch, "infer/generate", {"prompt": "three", "max_tokens": 2})
    assert code == 429 and "queue is full" in error["message"]
    assert int(headers["Retry-After"]) >= 1
    assert (await first)["text"] and (await second)["text"]
    assert service.metrics()["requests"]["rejected"] == 1


# -- engine errors ----------------------------------------------------------------------------
async def test_an_engine_error_fails_only_that_request(jp_fetch: Any) -> None:
    code, error, _ = await error_of(jp_fetch, "infer/generate", {"prompt": f"{POISON} me"})
    assert code == 500 and "The engine failed" in error["message"] and error["code"] == "engine_error"
    ok = await post_json(jp_fetch, "infer/generate", {"prompt": "fine", "max_tokens": 4})
    assert ok["usage"]["completion_tokens"] == 4
    metrics = json.loads((await jp_fetch("infer", "metrics")).body)
    assert metrics["requests"]["failed"] == 1 and metrics["requests"]["ok"] == 1


@pytest.mark.parametrize("infer_options", [{"engine": "hf", "model": "/nonexistent/model/dir"}])
async def test_an_engine_that_cannot_load_answers_503(jp_fetch: Any) -> None:
    code, error, _ = await error_of(jp_fetch, "infer/generate", {"prompt": "hi"})
    assert code == 503 and "not available" in error["message"]
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["state"] == "failed" and status["load_error"]
    code, error, _ = await error_of(jp_fetch, "infer/v1/completions", {"prompt": "hi"})
    assert code == 503 and error["error"]["type"] == "service_unavailable_error"


# -- status, metrics, Prometheus ---------------------------------------------------------------
async def test_status_and_metrics(jp_fetch: Any) -> None:
    await post_json(jp_fetch, "infer/generate", {"prompt": "hello", "max_tokens": 3})
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["state"] == "ready" and status["engine"] == "simulated"
    assert status["configured"]["engine"] == "simulated"
    assert {"max_batch_size", "max_queue_size", "max_new_tokens", "max_prompt_tokens"} <= set(status["limits"])
    assert status["limits"]["sse_keepalive_s"] == 15.0  # the client sizes its read timeout from it
    metrics = json.loads((await jp_fetch("infer", "metrics")).body)
    assert metrics["requests"]["ok"] == 1 and metrics["tokens"]["completion"] == 3
    assert {"ttft_ms", "latency_ms", "batch_size_histogram", "queue_depth"} <= set(metrics)


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and "}" in line and line.split("}")[0] + "}" == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_prometheus_metrics_on_the_server_endpoint(jp_fetch: Any) -> None:
    before = (await jp_fetch("metrics")).body.decode()
    await post_json(jp_fetch, "infer/generate", {"prompt": "count me", "max_tokens": 4})
    await error_of(jp_fetch, "infer/generate", {"prompt": ""})
    after = (await jp_fetch("metrics")).body.decode()
    ok = 'jupyter_infer_requests_total{outcome="ok"}'
    rejected = 'jupyter_infer_requests_total{outcome="rejected"}'
    completion = 'jupyter_infer_tokens_total{kind="completion"}'
    assert _sample(after, ok) == _sample(before, ok) + 1
    assert _sample(after, rejected) == _sample(before, rejected) + 1
    assert _sample(after, completion) == _sample(before, completion) + 4
    for name in ("jupyter_infer_time_to_first_token_seconds_count", "jupyter_infer_request_latency_seconds_count",
                 "jupyter_infer_batch_size_count", "jupyter_infer_queue_depth", "jupyter_infer_running_requests"):
        assert name in after



async def test_prometheus_gauges_read_this_apps_service_while_it_runs(jp_fetch: Any, jp_serverapp: Any) -> None:
    from jupyter_infer.server import prometheus

    extension = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_infer"]))
    service = service_of(jp_serverapp)
    assert extension.prometheus_collector.service is service
    assert not hasattr(prometheus, "_service")  # no module global names a service
    subscription = service.subscribe()
    try:
        text = (await jp_fetch("metrics")).body.decode()
    finally:
        subscription.close()
    assert _sample(text, "jupyter_infer_event_subscribers") == 1
    assert _sample((await jp_fetch("metrics")).body.decode(), "jupyter_infer_event_subscribers") == 0
    await extension.stop_extension()
    stopped = (await jp_fetch("metrics")).body.decode()
    assert "jupyter_infer_queue_depth" not in stopped and "jupyter_infer_event_subscribers" not in stopped

# -- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_batch_size": -1}, "InferApp.max_batch_size must be 0"),
        ({"device": "tpu"}, "InferApp.device must be"),
        ({"simulated_token_delay_ms": [5.0, 1.0]}, "0 <= low <= high"),
        ({"batch_window_ms": -1.0}, "InferApp.batch_window_ms must be 0 or more"),
        ({"engine": "tgi"}, "engine"),
        ({"mode": "eager"}, "mode"),
    ],
)
def test_invalid_traits_say_what_to_fix(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        InferApp(**options).service_config()


def test_every_trait_has_help() -> None:
    for name, trait in InferApp.class_own_traits(config=True).items():
        assert trait.help, name


def test_every_knob_is_declared_once_and_is_a_trait_with_its_help_and_default() -> None:
    """A ``ServiceConfig`` field is the whole declaration of a knob: ``InferApp`` has a trait of
    it, with its help text, and an unconfigured app gives the defaults back."""
    traits = InferApp.class_traits(config=True)
    for knob in dataclasses.fields(ServiceConfig):
        assert knob.metadata["help"] and traits[knob.name].help == knob.metadata["help"], knob.name
    assert InferApp().service_config() == ServiceConfig()


@pytest.mark.parametrize("infer_options", [{"max_queue_size": 0, "mode": "window", "model": "/m"}])
async def test_an_invalid_configuration_fails_clearly_instead_of_using_defaults(jp_fetch: Any) -> None:
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["state"] == "failed"
    assert "InferApp.max_queue_size must be at least 1" in status["load_error"]
    # What was given, not the defaults the service would have run on.
    given = {"model": "/m", "max_queue_size": 0, "mode": "window"}
    assert {name: status["configured"].get(name) for name in given} == given
    code, error, _ = await error_of(jp_fetch, "infer/generate", {"prompt": "hi"})
    assert code == 503 and "InferApp.max_queue_size" in error["message"]


@pytest.mark.parametrize("infer_options", [{"mode": "continuous"}])
async def test_batch_size_default_follows_the_mode(jp_fetch: Any) -> None:
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["limits"]["max_batch_size"] == 32


async def test_each_generating_request_gets_an_access_log_line(jp_fetch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A server's access log: method, route, status, who, tokens in and out, time; refusals too."""
    import logging

    caplog.set_level(logging.INFO, logger="jupyter_infer.access")
    answer = await post_json(jp_fetch, "infer/generate", {"prompt": "What is batching?", "max_tokens": 3})
    code, _, _ = await error_of(jp_fetch, "infer/generate", {"prompt": 5})
    await jp_fetch("infer", "status")  # polled by panels every second: not logged
    lines = [r.getMessage() for r in caplog.records if r.name == "jupyter_infer.access"]
    assert len(lines) == 2, lines
    tokens = f"tokens={answer['usage']['prompt_tokens']}+{answer['usage']['completion_tokens']}"
    assert lines[0].startswith("jupyter_infer | POST /") and "/infer/generate 200 user=local " in lines[0]
    assert tokens in lines[0] and lines[0].endswith(" ms") and f"/infer/generate {code} user=local" in lines[1]


# engine "auto" (its built-in default falls back to the simulated engine here): a real loader,
# where the other tests' scripted engine stands in for every load.
@pytest.mark.parametrize("infer_options", [{"engine": "auto", "num_threads": 1}])
async def test_models_are_listed_loaded_and_unloaded_without_a_restart(jp_fetch: Any, tiny_model_dir: Any) -> None:
    """infer/models: the list says what is loaded; a POST loads another in its place (the
    Jupyter server and its kernels go on), a DELETE unloads it and the next request brings it back."""
    await post_json(jp_fetch, "infer/generate", {"prompt": "hello", "max_tokens": 1})  # loaded
    listed = json.loads((await jp_fetch("infer", "models")).body)
    assert listed["state"] == "ready" and listed["models"][0]["loaded"]
    loaded = await post_json(jp_fetch, "infer/models", {"model": str(tiny_model_dir)})
    assert loaded["state"] == "ready" and loaded["model"] == str(tiny_model_dir)
    assert [m["path"] for m in loaded["models"] if m["loaded"]] == [str(tiny_model_dir)]
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["engine"] == "hf" and status["configured"]["model"] == str(tiny_model_dir)
    # its threads, as chosen (num_threads=1: kept), and whether other processes starve it
    assert status["cpu"]["threads"] == 1 and status["cpu"]["adapts"] is False and "starved" in status["cpu"]
    response = await jp_fetch("infer", "models", method="DELETE")
    assert json.loads(response.body)["state"] == "unloaded"
    answer = await post_json(jp_fetch, "infer/generate", {"prompt": "hello", "max_tokens": 2})
    assert answer["usage"]["completion_tokens"] == 2
    assert json.loads((await jp_fetch("infer", "status")).body)["state"] == "ready"
    code, error, _ = await error_of(jp_fetch, "infer/models", {"model": "/no/such/model"})
    assert code == 400 and "No model at /no/such/model" in error["message"]
    assert json.loads((await jp_fetch("infer", "status")).body)["state"] == "ready"  # nothing was dropped for it
    code, error, _ = await error_of(jp_fetch, "infer/models", {"modle": "x"})
    assert code == 400
