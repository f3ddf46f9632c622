"""The OpenAI-compatible routes, driven by the official ``openai`` client over a real port,
on both engines: the simulated one and the hf engine on a tiny locally built model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_helpers import POISON, service_of

pytestmark = pytest.mark.timeout(180)
ENGINES = ["simulated", "hf"]


@pytest.fixture(params=ENGINES)
def infer_options(request: pytest.FixtureRequest, tiny_model_dir: Path) -> dict[str, Any]:
    """Every test here runs on both engines."""
    if request.param == "hf":
        return {"engine": "hf", "model": str(tiny_model_dir), "dtype": "float32", "num_threads": 1,
                "max_new_tokens": 64}
    return {"max_new_tokens": 64}


async def served(client: openai.AsyncOpenAI) -> str:
    return (await client.models.list()).data[0].id


def texts_by_index(chunks: list[Any], chat: bool = False) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            out[c.index] = out.get(c.index, "") + ((c.delta.content or "") if chat else c.text)
    return out


# -- models ---------------------------------------------------------------------------------------
async def test_models_list_and_retrieve(client: openai.AsyncOpenAI, infer_options: dict[str, Any]) -> None:
    models = await client.models.list()
    assert len(models.data) == 1
    card = models.data[0]
    assert card.id == infer_options.get("model", "simulated")  # hf: a folder path, '/' included
    assert card.owned_by == "jupyter_infer" and card.created > 0
    assert card.model_extra["max_model_len"] > 0
    again = await client.models.retrieve(card.id)
    assert again.id == card.id and again.model_extra["max_model_len"] == card.model_extra["max_model_len"]
    with pytest.raises(openai.NotFoundError, match="not served here"):
        await client.models.retrieve("gpt-4o")


# -- completions: several prompts, n, token ids ---------------------------------------------------------
async def test_completion(client: openai.AsyncOpenAI) -> None:
    model = await served(client)
    completion = await client.completions.create(model=model, prompt="Explain attention", max_tokens=8,
                                                 temperature=0, extra_body={"ignore_eos": True})
    assert completion.object == "text_completion" and completion.model == model
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and choice.index == 0
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8


async def test_completion_defaults_follow_openai(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(model="default", prompt="Explain attention",
                                                 extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16  # OpenAI's default max_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_without_max_tokens_runs_until_it_stops(client: openai.AsyncOpenAI, stream: bool) -> None:
    """The most common chat call leaves max_tokens out: as many as fit (it once failed with a
    500: the open max_tokens was resolved after the sequence had copied the parameters)."""
    # A seed: at temperature 1 the tiny random model may draw EOS first (0 tokens, seen once in CI).
    kw = {"model": "default", "messages": [{"role": "user", "content": "0"}], "seed": 0}
    if stream:
        chunks = [c async for c in await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw)]
        finish, usage = [c.choices[0].finish_reason for c in chunks if c.choices][-1], chunks[-1].usage
    else:
        chat = await client.chat.completions.create(**kw)
        finish, usage = chat.choices[0].finish_reason, chat.usage
    assert finish in ("stop", "length") and usage.completion_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_several_prompts_and_n_choices(client: openai.AsyncOpenAI, stream: bool) -> None:
    prompts = ["What is attention?", "KV cache", "Why batch requests?"]
    kw = {"model": "default", "max_tokens": 6, "temperature": 0, "n": 2, "extra_body": {"ignore_eos": True}}
    alone = [(await client.completions.create(prompt=p, **kw)).choices[0].text for p in prompts]
    if not stream:
        completion = await client.completions.create(prompt=prompts, **kw)
        assert [c.index for c in completion.choices] == list(range(6))
        got = {c.index: c.text for c in completion.choices}
        # Each prompt counts once in the usage, however many choices it has.
        singles = [await client.completions.create(prompt=p, **{**kw, "n": 1}) for p in prompts]
        assert completion.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
        assert completion.usage.completion_tokens == 6 * 6
    else:
        chunks = [c async for c in await client.completions.create(
            prompt=prompts, stream=True, stream_options={"include_usage": True}, **kw)]
        got = texts_by_index(chunks)
        assert chunks[-1].usage.completion_tokens == 36 and chunks[-1].choices == []
        finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        assert sorted(c.index for c in finals) == list(range(6))
    # Greedy: both choices of a prompt are its answer alone, in prompt order.
    assert [got[i] for i in range(6)] == [a for a in alone for _ in range(2)]


async def test_n_choices_batch_together(client: openai.AsyncOpenAI, jp_serverapp: Any) -> None:
    await client.completions.create(model="default", prompt="warm up", max_tokens=2)
    completion = await client.completions.create(model="default", prompt=["a b", "c d"], n=2, max_tokens=4,
                                                 temperature=0.8, seed=5)
    records = service_of(jp_serverapp).batches(limit=50)["requests"][-4:]
    assert len({r["batch_id"] for r in records}) == 1  # the four choices were admitted together
    assert len(completion.choices) == 4


async def test_token_id_prompts(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    prompts = ["The cat sat on the mat", "Dynamic batching"]
    ids = [(await http.post("../tokenize", json={"prompt": p})).json()["tokens"] for p in prompts]
    kw = {"model": "default", "max_tokens": 5, "temperature": 0, "extra_body": {"ignore_eos": True}}
    by_text = await client.completions.create(prompt=prompts, **kw)
    by_ids = await client.completions.create(prompt=ids, **kw)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert by_ids.usage.prompt_tokens == sum(map(len, ids))
    one = await client.completions.create(prompt=ids[0], echo=True, **kw)  # a flat list is one prompt
    assert one.choices[0].text == prompts[0] + by_text.choices[0].text
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        await client.completions.create(prompt=[10**9], **kw)


# -- log probabilities and echo ---------------------------------------------------------------------
async def test_echo_with_logprobs_is_what_loglikelihood_evals_read(client: openai.AsyncOpenAI) -> None:
    prompt = "The capital of France is Paris"
    for max_tokens in (1, 0):
        completion = await client.completions.create(
            model="default", prompt=[prompt, prompt + " indeed"], max_tokens=max_tokens, logprobs=1,
            echo=True, temperature=0)
        first = completion.choices[0]
        lp = first.logprobs
        n_prompt = len(lp.tokens) - max_tokens
        assert "".join(lp.tokens[:n_prompt]) == prompt and first.text.startswith(prompt)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(x <= 0 for x in lp.token_logprobs[1:])
        assert all(len(top) >= 1 and max(top.values()) >= x  # what lm-eval's is_greedy compares
                   for top, x in zip(lp.top_logprobs[1:], lp.token_logprobs[1:], strict=True))
        assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
        assert completion.usage.completion_tokens == 2 * max_tokens
        # The shared prefix has the same logprobs in both prompts.
        second = completion.choices[1].logprobs
        assert second.token_logprobs[:n_prompt] == pytest.approx(lp.token_logprobs[:n_prompt], abs=1e-4)


async def test_completion_logprobs_streamed_match_whole(client: openai.AsyncOpenAI) -> None:
    kw = {"model": "default", "prompt": "Explain the KV cache", "max_tokens": 6, "temperature": 0,
          "logprobs": 3, "echo": True, "extra_body": {"ignore_eos": True}}
    whole = (await client.completions.create(**kw)).choices[0]
    chunks = [c async for c in await client.completions.create(stream=True, **kw)]
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((lp.tokens for lp in streamed), []) == whole.logprobs.tokens
    assert sum((lp.token_logprobs for lp in streamed), []) == pytest.approx(whole.logprobs.token_logprobs)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    assert all(len(top) >= 3 for top in whole.logprobs.top_logprobs[1:])


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs_and_n(client: openai.AsyncOpenAI, stream: bool) -> None:
    kw = {"model": "default", "messages": [{"role": "user", "content": "What is batching?"}],
          "max_completion_tokens": 5, "temperature": 0, "n": 2, "logprobs": True, "top_logprobs": 3,
          "extra_body": {"ignore_eos": True}}
    if stream:
        chunks = [c async for c in await client.chat.completions.create(stream=True, **kw)]
        content: dict[int, list[Any]] = {0: [], 1: []}
        for chunk in chunks:
            for c in chunk.choices:
                if c.logprobs and c.logprobs.content:
                    content[c.index] += c.logprobs.content
        texts = texts_by_index(chunks, chat=True)
        assert {c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"} == {0, 1}
    else:
        chat = await client.chat.completions.create(**kw)
        assert [c.index for c in chat.choices] == [0, 1] and chat.usage.completion_tokens == 10
        content = {c.index: c.logprobs.content for c in chat.choices}
        texts = {c.index: c.message.content for c in chat.choices}
    for i in (0, 1):
        assert len(content[i]) == 5
        assert "".join(t.token for t in content[i]) == texts[i]
        for t in content[i]:
            assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token and len(t.top_logprobs) == 3
            assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob


# -- sampling extras, tolerance -----------------------------------------------------------------------
async def test_unknown_fields_are_ignored_and_named(client: openai.AsyncOpenAI) -> None:
    raw = await client.completions.with_raw_response.create(
        model="default", prompt="hi", max_tokens=3, temperature=0,
        extra_body={"top_k": 5, "wibble": 1, "guided_decoding_backend": None, "min_p": 0.1},
    )
    assert raw.headers["x-ignored-fields"] == "guided_decoding_backend, min_p, wibble"
    assert raw.parse().choices[0].text is not None
    chat = await client.chat.completions.with_raw_response.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="me",
        extra_body={"chat_template_kwargs": {}, "reasoning_wibble": True},
    )
    # chat_template_kwargs is read (it sets the template's variables): not named as ignored.
    assert chat.headers["x-ignored-fields"] == "reasoning_wibble"


async def test_sampling_extras_and_zero_values(client: openai.AsyncOpenAI) -> None:
    kw = {"model": "default", "prompt": "Explain continuous batching", "max_tokens": 12}
    a = await client.completions.create(temperature=1.0, seed=11, **kw)
    b = await client.completions.create(temperature=1.0, seed=11, **kw)
    assert a.choices[0].text == b.choices[0].text  # a seed makes sampling repeatable
    zeros = await client.completions.create(
        temperature=0.0, top_p=1.0, frequency_penalty=0.0, presence_penalty=0, n=1, logprobs=0, best_of=0,
        extra_body={"top_k": 0, "min_tokens": 0, "repetition_penalty": 0, "ignore_eos": False}, **kw)
    greedy = await client.completions.create(temperature=0, **kw)
    assert zeros.choices[0].text == greedy.choices[0].text
    extras = await client.completions.create(
        temperature=0.7, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.3, logit_bias={"3": -100},
        seed=2, extra_body={"top_k": 5, "min_tokens": 4, "repetition_penalty": 1.3}, **kw)
    assert extras.usage.completion_tokens >= 4


async def test_many_stop_strings(client: openai.AsyncOpenAI) -> None:
    kw = {"model": "default", "prompt": "Explain attention in transformers", "max_tokens": 24,
          "temperature": 0}
    text = (await client.completions.create(extra_body={"ignore_eos": True}, **kw)).choices[0].text
    middle = len(text) // 2
    cut = text[middle : middle + 3]  # a piece from the middle of the greedy answer
    assert len(cut) == 3, text
    stops = [f"never-{i}" for i in range(7)] + [cut]
    for stream in (False, True):
        if stream:
            chunks = [c async for c in await client.completions.create(stop=stops, stream=True, **kw)]
            got = texts_by_index(chunks)[0]
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            choice = (await client.completions.create(stop=stops, **kw)).choices[0]
            got, reason = choice.text, choice.finish_reason
        assert got == text[: text.index(cut)] and reason == "stop"


async def test_streaming_as_guidellm_asks(client: openai.AsyncOpenAI) -> None:
    chunks = [c async for c in await client.completions.create(
        model="default", prompt="Tell me about GPUs", max_tokens=10, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "max_completion_tokens": 10},
    )]
    assert all(c.usage is not None for c in chunks)  # usage on every chunk
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 10
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 0


async def test_chat_completion_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is a KV cache?"}]}]
    kw = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": 12,
          "extra_body": {"ignore_eos": True}}
    whole = await client.chat.completions.create(**kw)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == 12
    chunks = [c async for c in await client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw)]
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert texts_by_index(chunks, chat=True)[0] == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"


# -- errors in the client's language ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("route", "body", "param", "message"),
    [
        ("completions", {"prompt": "hi", "n": 0}, "n", "'n' must be an integer"),
        ("completions", {"prompt": "hi", "logprobs": 21}, "logprobs", "from 0 to 20"),
        ("completions", {"prompt": "hi", "best_of": 3}, "best_of", "above n"),
        ("completions", {"prompt": "hi", "suffix": "x"}, "suffix", "suffix"),
        ("completions", {"prompt": []}, "prompt", "token-id lists"),
        ("completions", {"prompt": [[1], []]}, "prompt", "token-id lists"),
        ("completions", {"prompt": [1, "a"]}, "prompt", "token-id lists"),
        ("completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens", "integer from 0"),
        ("completions", {"prompt": "hi", "temperature": 3}, "temperature", "between"),
        ("completions", {"prompt": "hi", "stop": [f"s{i}" for i in range(65)]}, "stop", "at most 64"),
        ("completions", {"prompt": ["a"] * 5, "n": 30}, "prompt", "InferApp.max_choices"),
        ("chat/completions", {"messages": []}, "messages", "non-empty list"),
        ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages", "role"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice",
         "not among the request's tools"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "xml"}}, "response_format", "Unsupported response_format"),
        ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages", "text parts"),
    ],
)
async def test_bad_requests_get_openai_shaped_400s(
    http: httpx.AsyncClient, route: str, body: dict[str, Any], param: str, message: str
) -> None:
    response = await http.post(route, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"]
    ok = await http.post("completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize("infer_options", [{"max_prompt_tokens": 16}])
async def test_one_refused_choice_queues_none(http: httpx.AsyncClient, jp_serverapp: Any) -> None:
    service = service_of(jp_serverapp)
    response = await http.post("completions", json={"prompt": ["fine", "word " * 40], "max_tokens": 4})
    assert response.status_code == 400 and "max_prompt_tokens" in response.json()["error"]["message"]
    snapshot = service.metrics()["requests"]
    assert snapshot["ok"] == 0 and service.queue_depth == 0 and service.num_running == 0


async def test_auth_failures_are_401_authentication_errors(base_url: str) -> None:
    stranger = openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        await stranger.models.list()
    assert err.value.body["type"] == "authentication_error" and "token" in err.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        await stranger.completions.create(model="default", prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        await stranger.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    await stranger.close()
    async with httpx.AsyncClient() as anonymous:  # no key at all
        response = await anonymous.post(f"{base_url}/completions", json={"prompt": "hi"})
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


async def test_unknown_paths_and_wrong_methods_answer_openai_json(http: httpx.AsyncClient) -> None:
    for method, path, status in [("POST", "audio/speech", 404), ("GET", "no/such/thing", 404),
                                 ("GET", "completions", 405), ("DELETE", "chat/completions", 405),
                                 ("POST", "models", 405)]:
        response = await http.request(method, path)
        assert response.status_code == status, (method, path)
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error["message"] and error["type"] in {"not_found_error", "invalid_request_error"}


@pytest.mark.parametrize("infer_options", [{}])  # the scripted engine's poison pill
async def test_a_mid_stream_error_is_followed_by_done(http: httpx.AsyncClient) -> None:
    body = {"model": "default", "prompt": f"{POISON} me", "max_tokens": 3, "stream": True}
    async with http.stream("POST", "completions", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    blocks = [b for b in text.split("\n\n") if b and not b.startswith(":")]
    assert json.loads(blocks[-2].removeprefix("data: "))["error"]["type"] == "server_error"
    assert blocks[-1] == "data: [DONE]"


async def test_the_wire_ends_with_done(http: httpx.AsyncClient) -> None:
    body = {"model": "default", "prompt": "hi", "max_tokens": 3, "stream": True}
    async with http.stream("POST", "completions", json=body) as response:
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in text.split("\n\n") if b and not b.startswith(":")]
    assert blocks[-1] == "data: [DONE]"
    assert all(b.startswith("data: {") for b in blocks[:-1])
