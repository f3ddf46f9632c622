"""Ollama's API (``infer/api/...``), driven by the real clients over a real port: the ``ollama``
client (models, chat and generate whole and streamed, format, tools), LangChain's
``ChatOllama`` and LiteLLM's ``ollama_chat``; the NDJSON wire itself; load and unload idioms;
errors in Ollama's shape; and the same answer as the chat route for the same chat."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from server_helpers import POISON, TOKEN, eventually, service_of

pytestmark = pytest.mark.timeout(180)

BEARER = {"Authorization": f"Bearer {TOKEN}"}
ASK = [{"role": "user", "content": "What is a KV cache?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL_PARIS = [{"role": "user", "content": 'Call get_weather for "Paris" please.'}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture
def server_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    """What Ollama's clients are given as the host: they post to ``<host>/api/chat``."""
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer"


@pytest.fixture
def llama(server_url: str, jp_asyncio_loop: Any) -> Any:
    api = ollama.AsyncClient(host=server_url, headers=BEARER, timeout=60)
    yield api
    jp_asyncio_loop.run_until_complete(api._client.aclose())


@pytest.fixture
def raw(server_url: str, jp_asyncio_loop: Any) -> Any:
    client = httpx.AsyncClient(base_url=server_url + "/api/", headers=BEARER, timeout=60)
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


async def streamed_chat(llama: ollama.AsyncClient, **kw: Any) -> tuple[str, list[Any], Any]:
    """The streamed content, the tool calls of every chunk, and the last chunk."""
    text, calls, last = "", [], None
    async for chunk in await llama.chat(stream=True, **kw):
        text += chunk.message.content or ""
        calls += chunk.message.tool_calls or []
        last = chunk
    return text, calls, last


def lines_of(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n") and "\n\n" not in text, text  # NDJSON: an object per line, no blank lines
    return [json.loads(line) for line in text.splitlines()]


# -- models ---------------------------------------------------------------------------------------
async def test_tags_show_ps_version(llama: ollama.AsyncClient, raw: httpx.AsyncClient) -> None:
    listed = (await llama.list()).models
    assert "simulated" in [m.model for m in listed]
    entry = next(m for m in listed if m.model == "simulated")
    assert entry.digest and entry.modified_at is not None and entry.details is not None
    shown = await llama.show("simulated:latest")  # Ollama's default tag is accepted
    assert shown.capabilities == ["completion", "tools"]  # no reasoning, no fill-in-the-middle tokens
    # The context length under the family api/tags gives (Notebook Intelligence looks it up so).
    assert shown.modelinfo["general.architecture"] == entry.details.family == "unknown"
    assert shown.modelinfo[f"{entry.details.family}.context_length"] > 0
    await llama.chat(model="simulated", messages=ASK, options={"num_predict": 1})  # loaded now
    running = (await llama.ps()).models
    assert [m.model for m in running] == ["simulated"] and running[0].context_length > 0
    assert running[0].expires_at.year > 2200  # InferApp.unload_after_s is off: never unloaded for idling
    assert (await raw.get("version")).json()["version"].count(".") == 2
    legacy = await raw.post("show", json={"name": "simulated"})  # the older spelling (LiteLLM sends it)
    assert legacy.status_code == 200 and legacy.json()["capabilities"] == shown.capabilities
    with pytest.raises(ollama.ResponseError) as err:
        await llama.show("llama3.2")
    assert err.value.status_code == 404 and "api/tags" in err.value.error


# -- chat -----------------------------------------------------------------------------------------
async def test_chat_whole_and_streamed(llama: ollama.AsyncClient) -> None:
    kw = {"model": "simulated", "messages": [{"role": "system", "content": "Be brief."}, *ASK], "options": GREEDY}
    whole = await llama.chat(**kw)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.model == "simulated"
    assert whole.message.role == "assistant" and whole.message.content
    assert 0 < whole.eval_count <= 12 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration > 0 and whole.load_duration >= 0
    text, calls, last = await streamed_chat(llama, **kw)
    assert text == whole.message.content and calls == []
    assert last.done and last.done_reason == whole.done_reason and last.eval_count == whole.eval_count
    assert last.prompt_eval_count == whole.prompt_eval_count


async def test_the_wire_of_a_stream(raw: httpx.AsyncClient) -> None:
    """``stream`` defaults to true: NDJSON, each object ``done: false`` but the last."""
    body = {"model": "simulated", "messages": ASK, "options": {"num_predict": 5}}
    async with raw.stream("POST", "chat", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    lines = lines_of(text)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["done_reason"] == "length" and lines[-1]["eval_count"] == 5
    assert all(line["message"]["role"] == "assistant" and line["created_at"].endswith("Z") for line in lines)
    assert {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"} <= set(lines[-1])


async def test_format_schema_constrains_the_answer(llama: ollama.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    answer = await llama.chat(model="simulated", messages=ASK, format=schema, options={"num_predict": 30})
    assert json.loads(answer.message.content) in ({"ok": True}, {"ok": False})
    answer = await llama.generate(model="simulated", prompt="Say it in JSON.", format="json",
                                  options={"num_predict": 60})
    assert answer.done_reason == "stop", answer.response
    assert isinstance(json.loads(answer.response), dict)


async def test_tool_calls_whole_and_streamed(llama: ollama.AsyncClient) -> None:
    kw = {"model": "simulated", "messages": CALL_PARIS, "tools": [WEATHER], "options": {"num_predict": 60}}
    whole = await llama.chat(**kw)
    calls = whole.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert whole.done_reason == "stop"
    _, streamed, last = await streamed_chat(llama, **kw)
    assert [(c.function.name, c.function.arguments) for c in streamed] == [("get_weather", {"city": "Paris"})]
    assert last.done


async def test_a_tool_result_turn(llama: ollama.AsyncClient) -> None:
    messages = [*CALL_PARIS,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"}]
    answer = await llama.chat(model="simulated", messages=messages, tools=[WEATHER], options=GREEDY)
    assert answer.message.content and not answer.message.tool_calls


# -- the same chat through both dialects ----------------------------------------------------------
@pytest.fixture
def infer_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The simulated engine (scripted: tests/server_helpers.py), or, parametrized ``"hf"`` or
    ``"coder"`` (``indirect=True``), the hf engine on a tiny locally built model (coder-tiny:
    with fill-in-the-middle tokens)."""
    param = getattr(request, "param", None)
    if param == "two":  # tiny, and coder-tiny (by its folder's name) loaded beside it on demand
        tiny, coder = request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("coder_model_dir")
        return {"engine": "hf", "model": str(tiny), "max_new_tokens": 64, "max_loaded_models": 2,
                "load_on_demand": True, "model_dirs": [str(coder.parent)], "dtype": "float32", "num_threads": 1}
    if param in ("hf", "coder"):
        model: Path = request.getfixturevalue("tiny_model_dir" if param == "hf" else "coder_model_dir")
        return {"engine": "hf", "model": str(model), "dtype": "float32", "num_threads": 1, "max_new_tokens": 64}
    return {"max_new_tokens": 64}


@pytest.mark.parametrize("infer_options", ["simulated", "hf"], indirect=True)
async def test_the_dialect_costs_nothing(llama: ollama.AsyncClient, server_url: str) -> None:
    """The same chat with tools through chat completions and api/chat at temperature 0: the
    same prompt tokens and the same answer; and the model as api/show and api/ps tell it."""
    messages = [{"role": "system", "content": "You answer about the weather."}, *ASK]
    gpt = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        served = (await gpt.models.list()).data[0].id
        chat = await gpt.chat.completions.create(model=served, messages=messages, tools=[WEATHER],
                                                 max_tokens=10, temperature=0)
    finally:
        await gpt.close()
    answer = await llama.chat(model=served, messages=messages, tools=[WEATHER],
                              options={"num_predict": 10, "temperature": 0})
    assert answer.prompt_eval_count == chat.usage.prompt_tokens and answer.eval_count == chat.usage.completion_tokens
    said = chat.choices[0].message
    if said.tool_calls:  # the tiny random model may call the tool: the same call
        assert [(c.function.name, c.function.arguments) for c in answer.message.tool_calls] == [
            (c.function.name, json.loads(c.function.arguments)) for c in said.tool_calls]
    else:
        assert answer.message.content == said.content
    shown, running = await llama.show(served), (await llama.ps()).models
    assert [m.model for m in running] == [served] and running[0].details.family == shown.details.family
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == running[0].context_length


@pytest.mark.parametrize("infer_options", ["coder"], indirect=True)
async def test_suffix_is_code_infill(llama: ollama.AsyncClient, server_url: str) -> None:
    """A code model (fill-in-the-middle tokens) says ``insert`` in api/show, and generate with
    a suffix is the completions route's infill: the same prompt, the same greedy middle."""
    before, after = "def area(r):\n    return ", "\n\nprint(area(2))\n"
    gpt = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        served = (await gpt.models.list()).data[0].id
        theirs = await gpt.completions.create(model=served, prompt=before, suffix=after, max_tokens=8, temperature=0)
    finally:
        await gpt.close()
    assert "insert" in (await llama.show(served)).capabilities
    ours = await llama.generate(model=served, prompt=before, suffix=after, options={"num_predict": 8, "temperature": 0})
    assert ours.response == theirs.choices[0].text and ours.prompt_eval_count == theirs.usage.prompt_tokens
    plain = await llama.generate(model=served, prompt=before, raw=True, options={"num_predict": 8, "temperature": 0})
    assert plain.prompt_eval_count < ours.prompt_eval_count  # the suffix and the markers are read too


@pytest.mark.parametrize("infer_options", ["two"], indirect=True)
async def test_a_model_beside_the_loaded_one(llama: ollama.AsyncClient) -> None:
    """With InferApp.max_loaded_models, api/ps lists both models in memory, api/show says what
    each one is, and keep_alive 0 unloads the one it names, not the other."""
    answer = await llama.generate(model="coder-tiny:latest", prompt="def f(", raw=True, options={"num_predict": 2})
    assert answer.eval_count == 2
    await llama.chat(model="tiny", messages=ASK, options={"num_predict": 1})
    running = {Path(m.model).name: m for m in (await llama.ps()).models}
    assert set(running) == {"tiny", "coder-tiny"} and running["coder-tiny"].details.family == "llama"
    assert running["tiny"].details.family == "gpt2"
    assert "insert" in (await llama.show("coder-tiny")).capabilities
    assert "insert" not in (await llama.show("tiny")).capabilities
    assert (await llama.generate(model="coder-tiny", prompt="", keep_alive=0)).done_reason == "unload"
    assert [Path(m.model).name for m in (await llama.ps()).models] == ["tiny"]


# -- generate, load and unload ---------------------------------------------------------------------
async def test_generate_whole_streamed_and_raw(llama: ollama.AsyncClient) -> None:
    kw = {"model": "simulated", "prompt": "What is a KV cache?", "system": "Be brief.", "options": GREEDY}
    whole = await llama.generate(**kw)
    assert whole.response and whole.done and 0 < whole.eval_count <= 12
    parts = [chunk async for chunk in await llama.generate(stream=True, **kw)]
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count  # the same chat template around it
    raw = await llama.generate(model="simulated", prompt="What is a KV cache?", raw=True, options=GREEDY)
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no template, no system turn


async def test_load_and_unload_idioms(llama: ollama.AsyncClient, jp_serverapp: Any) -> None:
    """An empty prompt (or no messages) loads the model; with keep_alive 0 it unloads it; an
    answer with keep_alive 0 unloads it after; the next request loads it again."""
    unloaded = await llama.generate(model="simulated", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and (await llama.ps()).models == []
    loaded = await llama.generate(model="simulated", prompt="")
    assert loaded.done_reason == "load" and [m.model for m in (await llama.ps()).models] == ["simulated"]
    assert (await llama.chat(model="simulated", messages=[])).done_reason == "load"
    answer = await llama.chat(model="simulated", messages=ASK, options={"num_predict": 2}, keep_alive=0)
    assert answer.eval_count == 2
    shelf = service_of(jp_serverapp).models
    await eventually(lambda: shelf.unloaded)
    assert (await llama.ps()).models == []
    again = await llama.chat(model="simulated:latest", messages=ASK, options={"num_predict": 2}, keep_alive="5m")
    assert again.eval_count == 2 and again.model == "simulated:latest"  # the name as the client sent it


# -- other clients ---------------------------------------------------------------------------------
async def test_langchain_chat_ollama(server_url: str) -> None:
    from langchain_ollama import ChatOllama

    model = ChatOllama(model="simulated", base_url=server_url, client_kwargs={"headers": BEARER},
                       temperature=0, num_predict=12)
    whole = await model.ainvoke("What is a KV cache?")
    streamed = "".join([chunk.content async for chunk in model.astream("What is a KV cache?")])
    assert whole.content and streamed == whole.content
    assert whole.usage_metadata["output_tokens"] <= 12
    tools = ChatOllama(model="simulated", base_url=server_url, client_kwargs={"headers": BEARER},
                       num_predict=60).bind_tools([WEATHER])
    called = await tools.ainvoke('Call get_weather for "Paris" please.')
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]


async def test_litellm_ollama_chat(server_url: str, llama: ollama.AsyncClient,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's ``ollama_chat/`` provider, the token as its ``api_key`` (it sends it as a bearer
    token, to api/chat and to the api/show it asks for the model's context). LiteLLM makes
    blocking calls of its own: it runs on a thread, the server on this loop."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list: offline
    import litellm

    litellm.telemetry = False
    kw = {"model": "ollama_chat/simulated", "messages": ASK, "api_base": server_url, "api_key": TOKEN,
          "temperature": 0, "max_tokens": 12, "timeout": 60}
    answer = await asyncio.to_thread(litellm.completion, **kw)
    ours = await llama.chat(model="simulated", messages=ASK, options=GREEDY)
    assert answer.choices[0].message.content == ours.message.content
    assert answer.usage.completion_tokens == ours.eval_count

    def stream() -> str:
        return "".join(c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **kw))

    assert await asyncio.to_thread(stream) == ours.message.content
    called = await asyncio.to_thread(litellm.completion, **{**kw, "messages": CALL_PARIS, "tools": [WEATHER],
                                                             "max_tokens": 60})
    calls = called.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


async def test_ollama_host_and_api_key_from_the_environment(server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What tools built on the ollama client read (Notebook Intelligence's Ollama provider
    included): OLLAMA_HOST, and OLLAMA_API_KEY sent as the bearer token."""
    monkeypatch.setenv("OLLAMA_HOST", server_url)
    monkeypatch.setenv("OLLAMA_API_KEY", TOKEN)
    client = ollama.AsyncClient()
    try:
        assert "simulated" in [m.model for m in (await client.list()).models]
    finally:
        await client._client.aclose()


# -- errors, in Ollama's shape ---------------------------------------------------------------------
async def test_auth_is_jupyters(raw: httpx.AsyncClient, server_url: str) -> None:
    body = {"model": "simulated", "messages": ASK, "stream": False}
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
        refused = await raw.post("chat", json=body, headers=headers)
        assert refused.status_code == 401 and "Bearer <token>" in refused.json()["error"], headers
        assert (await raw.get("tags", headers=headers)).status_code == 401
    with pytest.raises(ollama.ResponseError) as err:
        await ollama.AsyncClient(host=server_url).list()
    assert err.value.status_code == 401


BAD_BODIES = [
    ("chat", {"messages": ASK}, "model is required"),
    ("chat", {"model": "llama3.2", "messages": ASK}, "not served here"),
    ("chat", {"model": "simulated", "messages": "hi"}, "'messages' must be a list"),
    ("chat", {"model": "simulated", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "images are not supported"),
    ("chat", {"model": "simulated", "messages": [{"role": "user", "content": ["x"]}]}, "must be a string"),
    ("chat", {"model": "simulated", "messages": [{"role": "robot", "content": "x"}]}, "supported roles"),
    ("chat", {"model": "simulated", "messages": ASK, "format": "xml"}, "'format' must be"),
    ("chat", {"model": "simulated", "messages": ASK, "options": {"temperature": 9}}, "'options.temperature'"),
    ("chat", {"model": "simulated", "messages": ASK, "options": {"num_predict": "lots"}}, "'options.num_predict'"),
    ("chat", {"model": "simulated", "messages": ASK, "options": "fast"}, "'options' must be"),
    ("chat", {"model": "simulated", "messages": ASK, "think": True}, "does not support thinking"),
    ("chat", {"model": "simulated", "messages": ASK, "keep_alive": "soon"}, "'keep_alive'"),
    ("chat", {"model": "simulated", "messages": ASK, "stream": "yes"}, "'stream'"),
    ("chat", {"model": "simulated", "messages": ASK, "tools": [{"type": "function"}]}, "tools[0]"),
    ("generate", {"model": "simulated", "prompt": 3}, "'prompt' must be a string"),
    ("generate", {"model": "simulated", "prompt": "def f(", "suffix": "\n    return x"}, "suffix"),
    ("generate", {"model": "simulated", "prompt": "x", "images": ["aGk="]}, "images are not supported"),
    ("pull", {"model": "llama3.2"}, "jupyter infer make-model"),
    ("delete", {"model": "simulated"}, "Ollama itself"),
    ([1, 2], {}, ""),
]


async def test_bad_bodies_are_4xx_in_ollama_shape(raw: httpx.AsyncClient, jp_serverapp: Any) -> None:
    """Each refused in Ollama's shape, naming what is wrong; nothing is queued (one server for all)."""
    for path, body, message in BAD_BODIES:
        if isinstance(path, list):  # a body that is not an object
            path, body = "chat", path
        method = "DELETE" if path == "delete" else "POST"
        response = await raw.request(method, path, json=body)
        assert 400 <= response.status_code < 500, (body, response.text)
        answer = response.json()
        assert set(answer) == {"error"} and message in answer["error"], (body, answer)
    service = service_of(jp_serverapp)
    assert service.metrics()["requests"]["ok"] == 0 and service.queue_depth == 0 and service.num_running == 0


async def test_no_such_route_and_ignored_fields(raw: httpx.AsyncClient) -> None:
    missing = await raw.get("nothing-here")
    assert missing.status_code == 404 and "docs/ollama.md" in missing.json()["error"]
    assert (await raw.get("chat")).status_code == 405 and "error" in (await raw.get("chat")).json()
    assert (await raw.head("blobs/sha256-0123")).status_code == 400  # ollama create's first call: refused
    body = {"model": "simulated", "messages": ASK, "stream": False, "template": "{{ .Prompt }}",
            "options": {"num_predict": 2, "num_ctx": 4096, "mirostat": 1}}
    answer = await raw.post("chat", json=body)
    assert answer.status_code == 200
    assert answer.headers["x-ignored-fields"] == "template, options.num_ctx, options.mirostat"


async def test_a_late_error_is_the_last_line(raw: httpx.AsyncClient, llama: ollama.AsyncClient) -> None:
    body = {"model": "simulated", "messages": [{"role": "user", "content": f"{POISON} me"}]}
    async with raw.stream("POST", "chat", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.status_code == 200 and set(lines_of(text)[-1]) == {"error"}
    with pytest.raises(ollama.ResponseError):
        await streamed_chat(llama, model="simulated", messages=body["messages"])


# -- embeddings ------------------------------------------------------------------------------------
async def test_embed_and_the_older_embeddings_route(llama: ollama.AsyncClient, raw: httpx.AsyncClient,
                                                    server_url: str) -> None:
    texts = ["the KV cache stores keys", "gradient descent"]
    embedded = await llama.embed(model="simulated", input=texts)
    assert embedded.model == "simulated" and len(embedded.embeddings) == 2
    assert all(abs(sum(v * v for v in vector) - 1) < 1e-5 for vector in embedded.embeddings)
    assert embedded.prompt_eval_count > 0 and embedded.total_duration > 0
    one = await llama.embeddings(model="simulated:latest", prompt=texts[0])
    assert one.embedding == pytest.approx(embedded.embeddings[0], abs=1e-6)
    short = (await raw.post("embed", json={"model": "simulated", "input": texts[1], "dimensions": 8})).json()
    assert len(short["embeddings"][0]) == 8
    for body in ({"model": "simulated", "input": []}, {"model": "simulated", "prompt": ["a", "b"]},
                 {"model": "simulated", "input": "a", "dimensions": 0}, {"input": "a"}):
        refused = await raw.post("embed", json=body)
        assert refused.status_code == 400 and set(refused.json()) == {"error"}, body
    from langchain_ollama import OllamaEmbeddings

    lang = OllamaEmbeddings(model="simulated", base_url=server_url, client_kwargs={"headers": BEARER})
    assert await lang.aembed_query(texts[0]) == pytest.approx(embedded.embeddings[0], abs=1e-6)
    assert len(await lang.aembed_documents(texts)) == 2
