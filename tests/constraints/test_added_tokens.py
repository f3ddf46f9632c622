"""A checkpoint's added tokens that are text, not control (Qwen's ``<tool_call>``,
``<think>``): a constraint whose text holds them is followed, not failed. llguidance takes every
added token for a special one, while the model's tokenizer turns the text into them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from server_helpers import server_config, service_of

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen_like_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with Qwen2.5's text-like added tokens in its vocabulary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("added") / "tiny"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<think>", "</think>"])
    tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def jp_server_config(qwen_like_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(qwen_like_dir), max_new_tokens=64)


async def test_a_required_tool_call_is_made_where_tool_call_is_a_token_of_the_vocabulary(client: Any) -> None:
    answer = await client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        tool_choice="required", max_tokens=60, temperature=0)
    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)


@pytest.mark.parametrize("fast_forward", [True, False])
async def test_a_regex_that_spells_an_added_token_is_followed(client: Any, fast_forward: bool,
                                                              jp_serverapp: Any) -> None:
    service = service_of(jp_serverapp)
    await service.wait_ready()
    engine = service._loop.engine
    engine.grammars.fast_forward = fast_forward
    answer = await client.completions.create(model="default", prompt="Think:", max_tokens=20, temperature=0,
                                          extra_body={"structured_outputs": {"regex": r"<think>[a-z]{2,6}</think>"}})
    text = answer.choices[0].text
    assert text.startswith("<think>") and text.endswith("</think>") and answer.choices[0].finish_reason == "stop"
