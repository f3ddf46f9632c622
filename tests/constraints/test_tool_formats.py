"""Tool calls in the model family's own format (issue 31): the checkpoint's chat template
renders the tools, the calls and their results; the model's answer is constrained to, and read
back from, the format that template teaches (Hermes/Qwen, Llama 3 JSON, Mistral, Granite, and
Llama 3.2's calls as Python)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from family_templates import TEMPLATES, family_checkpoint
from server_helpers import parse_sse, server_config, service_of

from jupyter_infer.constraints.tool_formats import FORMATS, HERMES, of_template
from jupyter_infer.constraints.tools import ToolSet, parse_calls, parser_for
from jupyter_infer.values.config import TOOL_CALL_FORMATS, ServiceConfig

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The tools' own text as each family's template shows them.
TOOLS_SHOWN = {"hermes": "<tools>", "llama3_json": "Given the following functions", "mistral": "[AVAILABLE_TOOLS]",
               "granite": "available_tools", "pythonic": "[func_name1(", "configured": '"parameters": <arguments object>'}


# -- the formats, without a model ----------------------------------------------------------------
def test_the_family_is_read_from_the_template() -> None:
    for family, template in TEMPLATES.items():
        assert of_template(template) == (FORMATS[family], True)
    builtin = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert of_template(builtin) == (HERMES, False) and of_template(None) == (HERMES, False)
    assert of_template(builtin, "llama3_json") == (FORMATS["llama3_json"], False)  # the setting wins
    assert of_template(TEMPLATES["mistral"], "hermes") == (HERMES, True)


def test_a_format_the_server_does_not_know_is_refused_at_startup() -> None:
    assert TOOL_CALL_FORMATS == ("", *FORMATS)
    with pytest.raises(ValueError, match="tool_call_format must be one of"):
        ServiceConfig(tool_call_format="smoke_signals")


@pytest.mark.parametrize("family", list(FORMATS))
@pytest.mark.parametrize("marker", [True, False])
def test_each_family_reads_back_whole_and_streamed(family: str, marker: bool) -> None:
    """Calls as the family writes them, whitespace as the templates lay it out or none; the
    marker there or not (a special token's text is not in decoded text)."""
    fmt = FORMATS[family]
    calls = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": 2}')][: 2 if fmt.parallel else 1]
    text = fmt.calls(calls)
    if not marker:
        text = text.removeprefix(fmt.marker)
    content, whole = parse_calls(text, fmt)
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole] == [
        (name, json.loads(args)) for name, args in calls]
    parser, deltas = parser_for(fmt), []
    for ch in text:
        deltas += parser.feed(ch)
    deltas += parser.finish()
    assert [d.name for d in deltas if d.name] == [name for name, _ in calls]
    assert all(d.content is None for d in deltas) and parser.complete == len(calls)
    assert parse_calls("Sunny in Paris.", fmt) == ("Sunny in Paris.", [])


def test_the_built_in_prompt_shows_the_configured_format() -> None:
    tools = ToolSet.from_body({"tools": [WEATHER]}).written_as(FORMATS["mistral"], {})
    assert '[TOOL_CALLS][{"name": <tool name>, "arguments": <arguments object>}]' in tools.system_prompt()
    # A text answer may not start as the calls do; a special-token marker is that token.
    assert "TEXT: /[^\\[]" in tools.lark()
    assert '<[2000]> "["' in tools.written_as(FORMATS["mistral"], {"[TOOL_CALLS]": 2000}).lark()


def test_the_body_s_tool_set_is_the_value_the_grammar_and_the_answer_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 55: the tools are read once from the body and carried as that value (a new one
    only where the model writes calls another way), never frozen to JSON and read back."""
    from dataclasses import replace

    from jupyter_infer.constraints.grammar import GrammarCompiler
    from jupyter_infer.loops.answer_stage import AnswerStage
    from jupyter_infer.values.request import Request, SamplingParams
    from jupyter_infer.values.sequence import Sequence
    from jupyter_infer.wire.chat import chat_for_model, parse_chat_and_tools
    from jupyter_infer.wire.upstream_openai import constraint_fields

    body = {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    as_mistral = replace(ToolSet.from_body(body), format="mistral")
    made, init = [], ToolSet.__init__
    monkeypatch.setattr(ToolSet, "__init__", lambda self, *a, **kw: (made.append(self), init(self, *a, **kw))[1])
    chat, wire, parsed = parse_chat_and_tools(body, None)
    request = Request("", SamplingParams(constraint=parsed), messages=chat, wire_messages=wire)
    compiler = GrammarCompiler.for_tokens([bytes([b]) for b in range(256)] + [b""], lambda data: list(data), 256)
    written = []
    for fmt in (HERMES, FORMATS["mistral"]):
        _, _, constraint = chat_for_model(request, fmt, False, {})
        grammar = compiler.compile(replace(constraint, after_reasoning="may"))  # as a reasoning model's prompt does
        seq = Sequence(replace(request, params=replace(request.params, constraint=grammar.constraint)), [1])
        AnswerStage().open(seq, fmt.name, reasons=False)
        assert grammar.constraint.tools is constraint.tools and seq.answer.named
        written.append(constraint)
    assert written[0] is parsed  # Hermes: the body's own constraint, its set as parsed
    assert written[1].tools == as_mistral and written[1].spec != parsed.spec
    assert [id(s) for s in made] == [id(parsed.tools), id(written[1].tools)]  # no set read back from JSON
    assert constraint_fields(written[1])["tools"] == [WEATHER]  # an upstream gets the body's tools


# -- through the server, one checkpoint per family --------------------------------------------------
@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model with 2,048 positions (tool prompts are long), and a copy per family."""
    from jupyter_infer.commands.model_builder import make_model

    base = tmp_path_factory.mktemp("families")
    tiny = make_model(base / "tiny-2k", "tiny", context=2048)
    return {"configured": tiny, **{family: family_checkpoint(tiny, base / family, family) for family in TEMPLATES}}


@pytest.fixture(params=[*TEMPLATES, "configured"])
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def jp_server_config(family_dirs: dict[str, Path], family: str) -> dict[str, Any]:
    if family == "configured":  # a template that renders no tools, the format set by hand
        return server_config(engine="hf", model=str(family_dirs[family]), max_new_tokens=64,
                             tool_call_format="llama3_json")
    return server_config(engine="hf", model=str(family_dirs[family]), max_new_tokens=64)


async def _prompt(http: Any, body: dict[str, Any]) -> str:
    """The prompt a chat body runs on (infer/tokenize renders it as the chat route does)."""
    infer = str(http.base_url).rstrip("/").removesuffix("v1")
    answer = (await http.post(infer + "tokenize", json=body)).json()
    assert "tokens" in answer, answer
    return (await http.post(infer + "detokenize", json={"tokens": answer["tokens"]})).json()["prompt"]


async def test_the_family_template_renders_the_tools_and_its_calls_come_back(
        client: Any, http: Any, family: str, jp_serverapp: Any) -> None:
    service = service_of(jp_serverapp)
    await service.wait_ready()
    fmt = FORMATS["llama3_json" if family == "configured" else family]
    assert service.status()["tool_calls"] == {
        "format": fmt.name, "prompt": "built-in" if family == "configured" else "chat template"}
    assert TOOLS_SHOWN[family] in await _prompt(http, {"messages": ASK, "tools": [WEATHER]})

    # Parallel calls asked only where the family writes one call an answer (Llama 3): a random
    # model given the choice writes calls until max_tokens.
    ask = dict(model="default", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required", temperature=0,
               parallel_tool_calls=not fmt.parallel)
    whole = (await client.chat.completions.create(**ask, max_tokens=60)).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    calls = whole.message.tool_calls
    assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls)
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls) and len(calls) == 1
    streamed: dict[int, list[str]] = {}
    async for chunk in await client.chat.completions.create(**ask, max_tokens=60, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            streamed.setdefault(delta.index, ["", ""])
            streamed[delta.index][0] += delta.function.name or ""
            streamed[delta.index][1] += delta.function.arguments or ""
    assert [tuple(v) for _, v in sorted(streamed.items())] == [(c.function.name, c.function.arguments) for c in calls]

    # The call and its result go back through the template, as the family renders them.
    call = calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    prompt = await _prompt(http, {"messages": history, "tools": [WEATHER, CLOCK]})
    # (up to the object's end: Mistral's template adds the call's id to it)
    assert fmt.call(call.function.name, json.dumps(json.loads(call.function.arguments)))[:-1] in prompt
    assert "18 C, sunny" in prompt
    after = await client.chat.completions.create(model="default", messages=history, tools=[WEATHER, CLOCK],
                                                 max_tokens=8, temperature=0)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


async def test_the_native_answer_is_the_family_text_and_names_its_format(
        jp_fetch: Any, family: str, jp_serverapp: Any) -> None:
    fmt = FORMATS["llama3_json" if family == "configured" else family]
    answer = json.loads((await jp_fetch("infer", "generate", method="POST", body=json.dumps(
        {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60}))).body)
    assert answer["tool_format"] == fmt.name
    # A special token's text (Mistral's, Granite's marker) is not in the decoded text.
    assert answer["text"].startswith(fmt.begin + fmt.open + fmt.head("get_weather"))
    assert parse_calls(answer["text"], fmt)[1][0]["function"]["name"] == "get_weather"
    # The stream's result event is the same native answer: it names the format too (it did not).
    streamed = await jp_fetch("infer", "generate_stream", method="POST", body=json.dumps(
        {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60}))
    result = next(e for e in parse_sse(streamed.body.decode())[0] if e.event == "result")
    assert {"tool_format": fmt.name, "model": answer["model"]}.items() <= json.loads(result.data).items()


@pytest.mark.parametrize("family", ["llama3_json"], indirect=True)  # the template that refuses parallel calls
async def test_a_template_that_refuses_the_history_is_a_400(client: Any, family: str) -> None:
    """Llama 3.1's template raises on two calls in one turn: a 400 that says so, not a 500."""
    import openai

    two = [{"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}
           for i in range(2)]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": two},
               *({"role": "tool", "tool_call_id": f"c{i}", "content": "18 C"} for i in range(2))]
    with pytest.raises(openai.BadRequestError, match="chat template refused"):
        await client.chat.completions.create(model="default", messages=history, tools=[WEATHER], max_tokens=4)
    # Tools nested past what the template's tojson can walk: the template's refusal, not "the tokenizer".
    deep = json.loads('{"type": "object", "properties": {"a": ' * 400 + "{}" + "}}" * 400)
    with pytest.raises(openai.BadRequestError, match="chat template refused"):
        await client.chat.completions.create(model="default", messages=ASK, max_tokens=4, tools=[
            {"type": "function", "function": {"name": "t", "parameters": deep}}])
    ok = await client.chat.completions.create(model="default", messages=ASK, max_tokens=4)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_calls_as_python_fit_each_argument_as_a_python_literal() -> None:
    """The pythonic grammar, on a byte-level vocabulary: required arguments in order, optional
    ones in order or left out, ``True``/``None`` (not JSON's), an enum's values; read back as JSON."""
    from jupyter_infer.constraints.grammar import GrammarCompiler

    eos = 256
    compiler = GrammarCompiler.for_tokens([bytes([b]) for b in range(256)] + [b""], lambda data: list(data), eos)
    tool = {"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "unit": {"enum": ["c", "f"]}, "note": {"type": ["string", "null"]}}, "required": ["city", "days"]}}}
    tools = ToolSet.from_body({"tools": [tool], "tool_choice": "required"}).written_as(FORMATS["pythonic"], {})

    def fits(text: str) -> bool:
        row = compiler.compile(tools.constraint()).row()
        for b in text.encode():
            if not row.allowed(257)[b]:
                return False
            row.advance([b])
        return bool(row.allowed(257)[eos])

    assert fits('[plan(city="Paris", days=3)]')
    assert fits('[plan(city="Paris", days=3, metric=True, unit="f", note=null)]')
    assert fits('[plan(city="Paris", days=3, unit="c")]')  # an optional one left out
    assert not fits('[plan(days=3, city="Paris")]')  # the schema's order
    assert not fits('[plan(city="Paris", days=3, metric=true)]')  # Python's True, not JSON's
    assert not fits('[plan(city="Parisienne", days=3)]')  # maxLength 8
    assert not fits('[plan(city="Paris")]')  # days is required
    ping = {"type": "function", "function": {"name": "ping"}}
    only_optional = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
    tools = ToolSet.from_body({"tools": [ping, only_optional], "tool_choice": "required"}).written_as(
        FORMATS["pythonic"], {})
    assert fits("[ping()]") and fits("[f()]") and fits("[f(b=2)]") and fits("[f(a=1, b=2)]")
    assert fits("[f(a=1), ping()]") and not fits("[f(, b=2)]") and not fits("[f(b=2, a=1)]")
    whole = '[plan(city="Paris", days=3, metric=True, note=None)]'
    assert parse_calls(whole, FORMATS["pythonic"])[1][0]["function"]["arguments"] == \
        '{"city": "Paris", "days": 3, "metric": true, "note": null}'


@pytest.mark.parametrize("family", ["pythonic"], indirect=True)
async def test_a_tool_python_cannot_name_is_a_400_on_a_pythonic_model(client: Any, family: str) -> None:
    import openai

    for name, params in (("get-weather", {}), ("plan", {"first-name": {"type": "string"}}),
                         ("plan", {"class": {"type": "string"}})):
        tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": params}}}
        with pytest.raises(openai.BadRequestError, match="not a Python name"):
            await client.chat.completions.create(model="default", messages=ASK, tools=[tool], max_tokens=8)
    ok = await client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER], max_tokens=8)
    assert ok.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_text_that_starts_with_a_bracket_is_text_in_pythonic() -> None:
    fmt = FORMATS["pythonic"]
    for text in ("[Note] the weather is fine.", "[1, 2, 3]", "[ok]"):
        parser, deltas = parser_for(fmt), []
        for ch in text:
            deltas += parser.feed(ch)
        deltas += parser.finish()
        assert "".join(d.content or "" for d in deltas) == text and not parser.calls, text
