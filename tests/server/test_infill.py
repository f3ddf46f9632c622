"""Code infill, the code between a prefix and a suffix: ``suffix`` on ``v1/completions`` (the
openai SDK's) and llama-server's ``infer/infill`` (its editor plugins'), written in the served
model's own fill-in-the-middle tokens; a model without them is a 400 that says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import TOKEN, parse_sse, server_config
from transformers import AutoTokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BEFORE, AFTER = "def area(r):\n    return ", "\n\nprint(area(2))\n"


@pytest.fixture
def jp_server_config(coder_model_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(coder_model_dir), max_new_tokens=32)


def fim_ids(model_dir: Path, text: str) -> list[int]:
    return AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"]


async def infill(jp_fetch: Any, **body: Any) -> dict[str, Any]:
    return json.loads((await jp_fetch("infer", "infill", method="POST", body=json.dumps(body))).body)


async def test_suffix_on_completions_reads_the_model_s_fim_prompt(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, coder_model_dir: Path
) -> None:
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)
    try:
        model = (await api.models.list()).data[0].id
        plain = await api.completions.create(model=model, prompt=BEFORE, max_tokens=8, temperature=0)
        filled = await api.completions.create(model=model, prompt=BEFORE, suffix=AFTER, max_tokens=8, temperature=0)
        with pytest.raises(openai.BadRequestError, match="echo"):
            await api.completions.create(model=model, prompt=BEFORE, suffix=AFTER, echo=True, max_tokens=4)
    finally:
        await api.close()
    wanted = fim_ids(coder_model_dir, f"<|fim_prefix|>{BEFORE}<|fim_suffix|>{AFTER}<|fim_middle|>")
    assert filled.usage.prompt_tokens == len(wanted)  # the markers are one token each
    assert plain.usage.prompt_tokens == len(fim_ids(coder_model_dir, BEFORE))
    # The same gap through llama-server's route: the same prompt, the same greedy middle.
    answer = await infill(jp_fetch, input_prefix=BEFORE, input_suffix=AFTER, n_predict=8, temperature=0)
    assert answer["content"] == filled.choices[0].text and answer["stop"] is True
    assert answer["tokens_evaluated"] == len(wanted) and answer["tokens_predicted"] <= 8
    assert answer["stop_type"] in ("eos", "limit") and answer["timings"]["prompt_n"] == len(wanted)


async def test_infill_streams_and_reads_the_project_s_other_files(jp_fetch: Any, coder_model_dir: Path) -> None:
    extra = [{"filename": "geometry/constants.py", "text": "PI = 3.14159\n"}]
    body = {"input_prefix": "import math\n", "prompt": BEFORE, "input_suffix": AFTER, "input_extra": extra,
            "n_predict": 6, "temperature": 0}
    whole = await infill(jp_fetch, **body)
    wanted = fim_ids(coder_model_dir, "<|file_sep|>geometry/constants.py\nPI = 3.14159\n\n"
                     f"<|fim_prefix|>import math\n{BEFORE}<|fim_suffix|>{AFTER}<|fim_middle|>")
    assert whole["tokens_evaluated"] == len(wanted)
    chunks: list[bytes] = []
    await jp_fetch("infer", "infill", method="POST", body=json.dumps({**body, "stream": True}),
                   streaming_callback=chunks.append)
    events, _ = parse_sse(b"".join(chunks).decode())
    objects = [json.loads(e.data) for e in events]
    assert [o["stop"] for o in objects][-1] is True and not any(o["stop"] for o in objects[:-1])
    assert "".join(o["content"] for o in objects[:-1]) == whole["content"] == objects[-1]["content"]


async def test_bad_infill_bodies_are_400s_that_name_the_field(jp_fetch: Any) -> None:
    for body, field in (({"input_prefix": 3}, "input_prefix"), ({"input_extra": [{"filename": "a"}]}, "input_extra"),
                        ({"input_suffix": ["x"]}, "input_suffix"), ({"n_predict": "many"}, "max_tokens")):
        with pytest.raises(Exception) as caught:
            await jp_fetch("infer", "infill", method="POST", body=json.dumps(body))
        assert caught.value.code == 400, body
        assert field in json.loads(caught.value.response.body)["message"], body


@pytest.mark.parametrize("jp_server_config", [server_config()], indirect=False)
async def test_a_model_without_fim_tokens_says_it_cannot_infill(jp_fetch: Any) -> None:
    with pytest.raises(Exception) as caught:
        await infill(jp_fetch, input_prefix=BEFORE, input_suffix=AFTER)
    assert caught.value.code == 400
    message = json.loads(caught.value.response.body)["message"]
    assert "fill-in-the-middle" in message and "Qwen2.5-Coder" in message
