"""Reasoning models: the answer's ``<think>`` section as ``reasoning_content`` (streamed as
``delta.reasoning_content``), the rest as ``content``, whether the answer opens the section
(Qwen3) or its chat template does (DeepSeek-R1's distills)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import TOKEN, server_config, service_of

from jupyter_infer.text.reasoning import ReasoningSplitter, split_reasoning

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}

QWEN3_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
                  # Qwen3's switch: the section comes empty in the prompt, so the model answers at once.
                  "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")
R1_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}{# ...</think> #}")
# R1's, with blank lines after the opening: the prompt's last tokens are newlines (the section
# was once judged open from the last four tokens' text, and so read as closed here).
R1_BLANK_TEMPLATE = R1_TEMPLATE.replace("<think>\n", "<think>" + "\n" * 6)
# The model opens the section, or its template does.
SHAPES = {"qwen3": QWEN3_TEMPLATE, "r1": R1_TEMPLATE, "r1_blank": R1_BLANK_TEMPLATE}
ANSWER = r"[A-Z][a-z]{2,6}"  # what the constraint asks of the answer after its section
# With the split off, a constraint applies from the first token: it spells the section out.
SPELLED = {"qwen3": r"<think>[a-z]{2,6} [a-z]{2,6}</think>\n[A-Z][a-z]{2,6}",
           "r1": r"[a-z]{2,6} [a-z]{2,6}</think>\n[A-Z][a-z]{2,6}",
           "r1_blank": r"[a-z]{2,6} [a-z]{2,6}</think>\n[A-Z][a-z]{2,6}"}


def reasoning_model(source: Path, folder: Path, template: str) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(source, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<think>", "</think>"])  # tokens of their own, as in Qwen3's vocabulary
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(params=sorted(SHAPES))
def shape(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def jp_server_config(shape: str, tiny_model_dir: Path, tmp_path: Path) -> dict[str, Any]:
    folder = reasoning_model(tiny_model_dir, tmp_path / shape, SHAPES[shape])
    return server_config(engine="hf", model=str(folder), max_new_tokens=128)


async def test_the_think_section_comes_as_reasoning_content_whole_and_streamed(
    shape: str, jp_serverapp: Any, jp_fetch: Any, jp_http_port: int, jp_base_url: str,
) -> None:
    """The constraint applies after the section (a random model is steered through one by
    logit_bias: it opens the section, then closes it at once), whole and streamed."""
    await service_of(jp_serverapp).wait_ready()
    assert json.loads((await jp_fetch("infer", "status")).body)["reasoning"] is True
    think, end = json.loads((await jp_fetch("infer", "tokenize", method="POST",
                                            body=json.dumps({"prompt": "<think></think>"}))).body)["tokens"]
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)
    body = {"model": "default", "messages": [{"role": "user", "content": "Which is it?"}], "max_tokens": 40,
            "temperature": 0, "logit_bias": {str(think): 50, str(end): 100},
            "extra_body": {"structured_outputs": {"regex": ANSWER}}}
    try:
        answer = (await api.chat.completions.create(**body)).choices[0]
        reasoning, content = answer.message.model_extra["reasoning_content"], answer.message.content
        assert reasoning == "" and re.fullmatch(ANSWER, content) and answer.finish_reason == "stop"
        streamed = {"reasoning_content": "", "content": ""}
        async for chunk in await api.chat.completions.create(**body, stream=True):
            delta = chunk.choices[0].delta
            streamed["reasoning_content"] += (delta.model_extra or {}).get("reasoning_content") or ""
            streamed["content"] += delta.content or ""
        assert streamed == {"reasoning_content": reasoning, "content": content}  # greedy: the same answer
        # Tool calls too come after the section.
        calls = (await api.chat.completions.create(
            **{**body, "extra_body": {}, "max_tokens": 120}, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False)).choices[0]
        assert calls.message.model_extra["reasoning_content"] == "" and calls.finish_reason == "tool_calls", calls
        assert calls.message.tool_calls[0].function.name == "get_weather"
    finally:
        await api.close()


@pytest.mark.parametrize("where", ["may", "open"])
def test_a_constraint_applies_after_the_reasoning_section(where: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The section holds any text but its closing tag (a tag's beginning included); the
    answer after it fits the constraint; a model that may reason may also answer at once."""
    from jupyter_infer.engine.hf import HFEngine
    from jupyter_infer.values.request import Constraint

    engine = HFEngine(str(reasoning_model(tiny_model_dir, tmp_path / "m", QWEN3_TEMPLATE)), dtype="float32",
                      num_threads=1)
    grammar = engine.grammars.compile(Constraint("regex", ANSWER, after_reasoning=where))

    def fits(text: str) -> bool:
        row = grammar.row()
        return row.matcher.consume_tokens(engine.text.tokenize(text)) and row.matcher.is_accepting()

    opened = "<think>" if where == "may" else ""
    assert fits(opened + "a <b> << </t x </thinkers</think>\n\nWord")
    assert fits(opened + "</think>Word")
    assert not fits(opened + "x</think>word") and not fits(opened + "x</think>Word</think>")
    assert fits("Word") is (where == "may")


async def test_split_reasoning_off_leaves_the_section_in_content(
    shape: str, jp_serverapp: Any, jp_fetch: Any, jp_http_port: int, jp_base_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = service_of(jp_serverapp)
    info = await service.wait_ready()
    monkeypatch.setattr(info, "reasoning", False)  # what InferApp.split_reasoning = False gives
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer/v1",
                             api_key=TOKEN, max_retries=0)
    try:
        answer = await api.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Which is it?"}], max_tokens=40, temperature=0,
            extra_body={"structured_outputs": {"regex": SPELLED[shape]}})
    finally:
        await api.close()
    message = answer.choices[0].message
    assert "</think>" in message.content and "reasoning_content" not in (message.model_extra or {})


@pytest.mark.parametrize(("text", "inside", "expected"), [
    ("<think>\nhmm, 2+2</think>\n\nIt is 4.", False, ("\nhmm, 2+2", "It is 4.")),
    ("hmm</think>It is 4.", True, ("hmm", "It is 4.")),
    ("<think>cut short by max_tokens", False, ("cut short by max_tokens", "")),
    ("No section <think> here", False, (None, "No section <think> here")),
    ("  <thin", False, (None, "  <thin")),
])
def test_a_split_is_the_same_whole_and_in_any_pieces(text: str, inside: bool, expected: tuple) -> None:
    assert split_reasoning(text, inside) == expected
    for size in (1, 2, 3, 7):
        splitter = ReasoningSplitter(inside)
        pieces = [p for i in range(0, len(text), size) for p in splitter.feed(text[i:i + size])] + splitter.finish()
        reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
        assert (reasoning if splitter.reasoned else None, "".join(t for k, t in pieces if k == "content")) == expected


@pytest.mark.parametrize("shape", ["qwen3"])
async def test_chat_template_kwargs_reach_the_template(shape: str, client: Any, http: Any) -> None:
    """vLLM's ``chat_template_kwargs``: Qwen3's ``enable_thinking: false`` puts an empty section
    in the prompt; what the template does not read changes nothing; a bad value is a 400."""
    messages = [{"role": "user", "content": "Which is it?"}]

    async def prompt_tokens(**extra: Any) -> int:
        answer = await client.chat.completions.create(model="default", messages=messages, max_tokens=2,
                                                      temperature=0, extra_body=extra)
        return answer.usage.prompt_tokens

    assert await prompt_tokens(chat_template_kwargs={"enable_thinking": False}) > await prompt_tokens()
    assert await prompt_tokens(chat_template_kwargs={"enable_thinking": True}) == await prompt_tokens()
    for bad in ([1], {"add_generation_prompt": False}, {"not a name": 1}, {"a" * 65: 1}):
        answer = await http.post("chat/completions", json={"messages": messages, "chat_template_kwargs": bad})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "chat_template_kwargs"


def test_an_upstream_server_gets_the_template_variables_as_sent() -> None:
    from jupyter_infer.values.request import Request
    from jupyter_infer.wire.upstream_openai import request_body

    request = Request(prompt="", messages=[{"role": "user", "content": "hi"}],
                      chat_template_kwargs={"enable_thinking": False})
    path, body = request_body(request, "qwen3")
    assert path == "chat/completions" and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_body(Request(prompt="", messages=request.messages), "qwen3")[1]
