"""A checkpoint's own sampling defaults (its generation_config.json) where an OpenAI request
leaves the fields out, as vLLM does; the native route stays greedy unless asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import TOKEN, server_config, service_of
from transformers import GenerationConfig

from jupyter_infer.text.generation_defaults import sampling_defaults
from jupyter_infer.values.engine_info import EngineInfo
from jupyter_infer.wire.openai_requests import parse_chat

# Qwen2.5-Instruct's, but a top_k small enough to show on a random model.
OWN = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 3, "repetition_penalty": 1.05}


@pytest.fixture(scope="module")
def sampling_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own-sampling") / "tiny"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **OWN}))
    return folder


@pytest.fixture
def jp_server_config(sampling_model_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(sampling_model_dir), max_new_tokens=64)


async def test_an_openai_request_that_leaves_sampling_out_gets_the_checkpoints_own(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_serverapp: Any,
) -> None:
    await service_of(jp_serverapp).wait_ready()
    status = json.loads((await jp_fetch("infer", "status")).body)
    assert status["sampling_defaults"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 3, "repetition_penalty": 1.05}

    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)

    async def text(seed: int, **sampling: Any) -> str:
        extra = {"ignore_eos": True, **sampling.pop("extra_body", {})}
        answer = await api.completions.create(model="default", prompt="the cat sat on the", max_tokens=16,
                                              seed=seed, extra_body=extra, **sampling)
        return answer.choices[0].text

    try:
        seeds = (1, 2, 3)
        left_out = [await text(seed) for seed in seeds]
        spelled = [await text(seed, temperature=0.7, top_p=0.8, extra_body={"top_k": 3, "repetition_penalty": 1.05})
                   for seed in seeds]
        assert left_out == spelled
        # OpenAI's own default (temperature 1, no top-k) samples differently on some seed.
        openai_default = [await text(seed, temperature=1.0, top_p=1.0, extra_body={"top_k": 0}) for seed in seeds]
        assert openai_default != left_out
    finally:
        await api.close()


async def test_the_native_route_stays_greedy_unless_asked(jp_fetch: Any) -> None:
    async def generate(**body: Any) -> str:
        answer = await jp_fetch("infer", "generate", method="POST",
                                body=json.dumps({"prompt": "the cat sat on the", "max_tokens": 12, **body}))
        return json.loads(answer.body)["text"]

    assert await generate() == await generate(temperature=0) == await generate(seed=5)


def test_the_defaults_come_from_the_generation_config_within_what_a_request_may_send() -> None:
    assert sampling_defaults(GenerationConfig(**OWN)) == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 3, "repetition_penalty": 1.05}
    assert sampling_defaults(GenerationConfig(temperature=0.6, top_p=0.9)) == {"temperature": 0.6, "top_p": 0.9}
    # do_sample false is greedy, as generate() reads it; nothing set is OpenAI's defaults.
    assert sampling_defaults(GenerationConfig(do_sample=False, temperature=0.6)) == {"temperature": 0.0}
    assert sampling_defaults(GenerationConfig()) == {} and sampling_defaults(None) == {}
    assert sampling_defaults(GenerationConfig(temperature=5.0, top_k=20)) == {"top_k": 20}  # out of range: left out


def test_what_a_request_sends_wins_over_the_defaults() -> None:
    info = EngineInfo("hf", "m", "cpu", "float32", 2048, sampling_defaults={"temperature": 0.6, "top_k": 20})
    body = {"messages": [{"role": "user", "content": "hi"}]}
    left_out = parse_chat(body, info, max_new_tokens=64, max_choices=4).requests[0].params
    assert (left_out.temperature, left_out.top_k, left_out.top_p) == (0.6, 20, 1.0)
    sent = parse_chat({**body, "temperature": 0, "top_k": -1}, info, max_new_tokens=64, max_choices=4)
    assert (sent.requests[0].params.temperature, sent.requests[0].params.top_k) == (0.0, 0)
    plain = EngineInfo("hf", "m", "cpu", "float32", 2048)
    assert parse_chat(body, plain, max_new_tokens=64, max_choices=4).requests[0].params.temperature == 1.0
