"""Fuzzing every route of a real server (both engines) with generated bodies, query strings and
path arguments: whatever arrives, the answer is never a 5xx, never a hang, an error is JSON in
the route's shape, and the server still serves afterwards.

One real ``jupyter server`` per engine for the whole module (``LocalServer``); each route gets
``FUZZ_EXAMPLES`` examples (default 250), derandomized so CI runs are repeatable.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_infer.kernel.launcher import LocalServer
from jupyter_infer.server.anthropic_handlers import AnthropicHandler
from jupyter_infer.server.handlers import routes
from jupyter_infer.server.ollama_handlers import OllamaHandler
from jupyter_infer.server.openai_handlers import OpenAIHandler
from jupyter_infer.wire import ollama_api
from jupyter_infer.wire.anthropic_messages import MESSAGES_FIELDS
from jupyter_infer.wire.embeddings import EMBEDDING_FIELDS
from jupyter_infer.wire.fields import GENERATE_FIELDS
from jupyter_infer.wire.llama_infill import INFILL_FIELDS
from jupyter_infer.wire.openai_requests import CHAT_FIELDS, COMPLETION_FIELDS
from jupyter_infer.wire.openai_responses import RESPONSES_FIELDS
from jupyter_infer.wire.rerank import RERANK_FIELDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SEEN: Counter[str] = Counter()  # examples sent, and statuses, for the report below


@pytest.fixture(scope="module", params=["simulated", "hf"])
def server(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[LocalServer]:
    options: dict[str, Any] = {"max_new_tokens": 8, "max_prompt_tokens": 256, "sse_keepalive_s": 1}
    if request.param == "hf":
        options |= {"engine": "hf", "model": str(tiny_model_dir)}
    else:
        options |= {"engine": "simulated", "simulated_token_delay_ms": [0, 0], "simulated_prefill_ms_per_token": 0}
    with LocalServer(**options) as local:
        with httpx.Client(base_url=local.url, headers=local.headers, timeout=60) as http:
            # The first generation waits for the engine to load.
            assert http.post("infer/generate", json={"prompt": "ready?", "max_tokens": 1}).status_code == 200
        yield local
        with httpx.Client(base_url=local.url, headers=local.headers, timeout=30) as http:
            assert http.get("api/status").status_code == 200  # Jupyter itself is fine
            answer = http.post("infer/generate", json={"prompt": "still serving?", "max_tokens": 2})
            assert answer.status_code == 200, answer.text
        assert "Traceback" not in local.log_tail(100_000), local.log_tail(60)


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    # A short timeout is the hang detector: every fuzzed request asks for at most 8 tokens.
    # A connection per request: one refused before its body was read is closed after the answer
    # (tornado's way not to read what it refused), and a reused one could race that close.
    headers = {**server.headers, "Connection": "close"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=20) as client:
        yield client


# -- what to send ---------------------------------------------------------------------------------
# Text with everything in it: lone surrogates (JSON escapes them), controls, line breaks, NUL.
TEXT = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["", " ", "\ud800", "hi \udfff", "\x00", "\r\n\r\n", "What is attention?", "a" * 3000, "😀" * 50,
     "<|endoftext|>", "\u202e", "ﬃ" * 20])
NUMBER = (st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from([0, 1, 2, 8, 9, -1, 0.5, 1e-7, 2**63, 10**4000]))
LEAF = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)


# Constraints: small real schemas, regexes and grammars, mutated, beside anything at all.
SCHEMA = st.sampled_from([{"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}},
                           "required": ["a"]}, {"enum": ["x", "y"]}, {"type": "string", "maxLength": 3}, {},
                          {"$ref": "#/nope"}, {"type": "wat"}, {"anyOf": []}, True, False]) | JSON
TOOL = st.fixed_dictionaries({"type": st.just("function") | TEXT, "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather"]) | TEXT}, optional={"parameters": SCHEMA, "description": TEXT})})
# Anthropic's shapes (infer/v1/messages): its tools, tool choices and content blocks.
ANTHROPIC_TOOL = st.fixed_dictionaries({"name": st.sampled_from(["f", "get_weather"]) | TEXT}, optional={
    "input_schema": SCHEMA, "description": TEXT, "type": st.sampled_from(["custom", "bash_20250124"]) | TEXT})
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image"]) | TEXT},
                              optional={"text": TEXT | JSON, "id": TEXT, "name": st.just("f") | TEXT, "input": JSON,
                                        "tool_use_id": TEXT, "content": TEXT | JSON})
# OpenAI Responses' shapes (infer/v1/responses): its input items and text format.
ITEM = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "item_reference"]) | TEXT,
    "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | TEXT, "call_id": TEXT,
    "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text",
                                                                               "input_image"]) | TEXT,
                                                      "text": TEXT | JSON}), max_size=2),
    "name": st.just("f") | TEXT, "arguments": TEXT, "output": TEXT | JSON})
CONSTRAINTS = {
    "json_schema": SCHEMA, "guided_json": SCHEMA,
    "regex": st.sampled_from(["[a-z]{2}", "a(", "(a+)+b", ".*", "\\d{3}"]) | TEXT, "guided_regex": TEXT,
    "choice": st.lists(TEXT, max_size=4), "guided_choice": st.lists(TEXT, max_size=4),
    "grammar": st.sampled_from(['start: "a" | "b"', 'root ::= "x" [0-9]', "start: ((", ""]) | TEXT,
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"]) | TEXT},
                                             optional={"json_schema": st.fixed_dictionaries(
                                                 {"name": TEXT, "schema": SCHEMA})}),
    "structured_outputs": st.dictionaries(st.sampled_from(["json", "regex", "choice", "grammar"]) | TEXT,
                                          SCHEMA | TEXT, max_size=2),
    "tools": st.lists(TOOL | ANTHROPIC_TOOL, max_size=3),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}},
                                    {"type": "any"}, {"type": "tool", "name": "f"}, {"type": "none"}]) | JSON,
    "output_config": st.fixed_dictionaries({"format": st.fixed_dictionaries(
        {"type": st.just("json_schema") | TEXT, "schema": SCHEMA})}) | JSON,
}


def field_values(name: str) -> st.SearchStrategy[Any]:
    """Near-valid values for a known field, and anything at all."""
    sane = {
        "prompt": st.sampled_from(["What is attention?", "Explain LoRA", "x"]) | TEXT,
        "max_tokens": st.integers(-2, 12), "max_completion_tokens": st.integers(-2, 12),
        "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-1, 50),
        "seed": st.integers(-1, 2**64), "priority": st.integers(-2000, 2000),
        "stop": st.lists(TEXT, max_size=6) | TEXT, "stream": st.booleans(), "model": st.sampled_from(
            ["default", "simulated", "nope"]) | TEXT,
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(
            ["user", "system", "assistant", "developer", "tool", ""]) | TEXT, "content": TEXT | JSON
            | st.lists(BLOCK, max_size=3)}), max_size=3),
        "system": TEXT | st.lists(BLOCK, max_size=2), "stop_sequences": st.lists(TEXT, max_size=4) | TEXT,
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive"]) | TEXT},
                                          optional={"budget_tokens": NUMBER}) | JSON,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | LEAF}),
        "input": TEXT | st.lists(ITEM, max_size=3), "instructions": TEXT, "max_output_tokens": st.integers(-2, 12),
        "previous_response_id": TEXT, "text": st.fixed_dictionaries({"format": st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema"]) | TEXT}, optional={"schema": SCHEMA})}),
        # Ollama's (infer/api/...): its options, format, keep_alive (never 0 here: each would unload the model).
        "options": st.fixed_dictionaries({}, optional={"num_predict": st.integers(-2, 12), "temperature": st.floats(-1, 3),
                                                       "num_ctx": NUMBER, "stop": st.lists(TEXT, max_size=3) | TEXT,
                                                       "repeat_penalty": NUMBER, "top_k": st.integers(-1, 50)}),
        "format": st.sampled_from(["json", ""]) | SCHEMA, "keep_alive": st.sampled_from(["5m", -1, "1h", "x"]),
        "think": st.booleans() | st.sampled_from(["high", "low"]), "raw": st.booleans(), "suffix": TEXT,
        # Embeddings, rerank, infill.
        "encoding_format": st.sampled_from(["float", "base64"]) | TEXT, "dimensions": st.integers(-1, 200),
        "query": TEXT, "documents": st.lists(TEXT | st.fixed_dictionaries({"text": TEXT}), max_size=3),
        "top_n": st.integers(-1, 4), "return_documents": st.booleans(), "input_prefix": TEXT, "input_suffix": TEXT,
        "input_extra": st.lists(st.fixed_dictionaries({"filename": TEXT, "text": TEXT}), max_size=2),
        "n_predict": st.integers(-2, 12),
        **CONSTRAINTS,
    }.get(name)
    return JSON if sane is None else sane | JSON


def bodies(fields: set[str], base: dict[str, Any] | None = None) -> st.SearchStrategy[bytes]:
    """A JSON object of known fields (some mutated, some unknown), other JSON, or raw bytes;
    with a valid ``base`` body, also that body with one field mutated (it reaches the engine)."""
    names = sorted(fields)
    objects = st.fixed_dictionaries({}, optional={n: field_values(n) for n in names}).flatmap(
        lambda body: st.dictionaries(TEXT, JSON, max_size=2).map(lambda extra: {**body, **extra})
        | st.just(body))
    if base is not None:
        objects |= st.sampled_from(names).flatmap(lambda n: field_values(n).map(lambda v: {**base, n: v}))
    as_json = (objects | JSON).map(lambda value: json.dumps(value).encode())
    nested = st.integers(1, 3000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n + b"}")
    raw = st.binary(max_size=300) | st.sampled_from(
        [b"", b"{", b'{"prompt": "\xed\xa0\x80"}', b'{"prompt": "\xff\xfe"}', b"\xff\xfe{\x00}\x00",
         b'{"prompt": "hi"}garbage', b'{"prompt": 1e999}'])
    return st.one_of(as_json, as_json, nested, raw)


def escape(text: str) -> str:
    """Percent-encoded UTF-8; a lone surrogate becomes the bytes ED A0 80 (not UTF-8)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


QUERY_NAMES = sorted(GENERATE_FIELDS | {"limit", "requests", "token", "_xsrf", "no_track_activity"})
QUERY_VALUE = TEXT | st.integers(-(2**70), 2**70).map(str) | st.floats().map(str) | st.sampled_from(
    ["1", "8", "0", "-1", "1e999", "nan", "²", "٣", "9" * 5000, "0x10", " 3 "])
QUERY = st.lists(st.tuples(st.sampled_from(QUERY_NAMES) | TEXT, QUERY_VALUE), max_size=5).map(
    lambda pairs: "&".join(f"{escape(k)}={escape(v)}" for k, v in pairs)
) | st.binary(max_size=30).map(lambda b: "prompt=" + "".join(f"%{c:02X}" for c in b))

PATH_ARG = TEXT.map(lambda text: escape(text) or "x") | st.binary(min_size=1, max_size=10).map(
    lambda b: "".join(f"%{c:02X}" for c in b))


# -- how to send it, and what must hold -------------------------------------------------------------
def check(response: httpx.Response, route: str, openai: bool) -> None:
    SEEN[f"{response.status_code // 100}xx"] += 1
    assert response.status_code < 500, (route, response.status_code, response.text[:300])
    assert "Traceback" not in response.text
    if route in OLLAMA_SHAPED:  # Ollama's {"error": "..."}; a stream's lines end done, or with a late error
        lines = [json.loads(line) for line in response.text.splitlines()]
        assert response.status_code < 400 or (len(lines) == 1 and isinstance(lines[0]["error"], str)), lines
        if response.status_code < 400 and route.endswith(("api/chat", "api/generate")):
            assert lines[-1].get("done") is True or set(lines[-1]) == {"error"}, lines[-1:]
    elif response.status_code >= 400:  # JSON in the route's shape
        body = response.json()
        error = body["error"] if openai else body
        assert isinstance(error["message"], str) and error["message"], body
    elif response.headers.get("Content-Type", "").startswith("text/event-stream"):
        # It ended as a stream ends (Responses' last event is response.completed, .incomplete or .failed).
        ends = r"^(event: (done|error|message_stop|response\.(completed|incomplete|failed))|data: \[DONE\]|data: \{\"error)"
        assert re.search(ends, response.text, re.M), response.text[-300:]


def send(http: httpx.Client, method: str, path: str, route: str, openai: bool, content: bytes | None = None) -> None:
    SEEN["examples"] += 1
    if route.endswith("infer/events"):  # never ends by itself: read its first bytes, then leave
        with http.stream(method, path) as response:
            SEEN[f"{response.status_code // 100}xx"] += 1
            assert response.status_code < 500
            next(response.iter_bytes(), b"")
        return
    check(http.request(method, path, content=content, headers={"Content-Type": "application/json"}), route, openai)


POST_FIELDS = {"infer/generate": GENERATE_FIELDS, "infer/generate_stream": GENERATE_FIELDS,
               "infer/v1/completions": COMPLETION_FIELDS, "infer/v1/chat/completions": CHAT_FIELDS,
               "infer/v1/messages": MESSAGES_FIELDS, "infer/v1/messages/count_tokens": MESSAGES_FIELDS,
               "infer/v1/responses": RESPONSES_FIELDS, "infer/api/chat": ollama_api.CHAT_FIELDS,
               "infer/api/generate": ollama_api.GENERATE_FIELDS, "infer/api/show": {"model", "name", "verbose"},
               "infer/v1/embeddings": EMBEDDING_FIELDS, "infer/v1/rerank": RERANK_FIELDS, "infer/rerank": RERANK_FIELDS,
               "infer/infill": INFILL_FIELDS}
_ASK = {"max_tokens": 4, "messages": [{"role": "user", "content": "What is attention?"}]}
VALID_BODIES = {"infer/v1/messages": _ASK, "infer/v1/messages/count_tokens": _ASK,
                "infer/v1/responses": {"max_output_tokens": 4, "input": "What is attention?"},
                "infer/api/chat": {"model": "default", "options": {"num_predict": 4}, **_ASK},
                "infer/api/generate": {"model": "default", "prompt": "What is attention?", "options": {"num_predict": 4}},
                "infer/v1/embeddings": {"input": ["What is attention?", "LoRA"]},
                "infer/v1/rerank": {"query": "attention", "documents": ["What is attention?", "LoRA"]},
                "infer/rerank": {"query": "attention", "documents": ["What is attention?", "LoRA"]},
                "infer/infill": {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}}


def verbs(handler: type) -> list[str]:
    """The verbs a handler answers (those it defines itself, not tornado's 405 defaults)."""
    from tornado.web import RequestHandler

    return [v for v in ("get", "post", "delete", "put", "patch") if getattr(handler, v) is not getattr(RequestHandler, v)]


ROUTES = [(verb.upper(), pattern.lstrip("/")) for pattern, handler in routes() for verb in verbs(handler)]
# Errors under an "error" key: OpenAI's {"error": {...}} and Anthropic's {"type": "error", "error": {...}}.
OPENAI_SHAPED = {pattern.lstrip("/") for pattern, handler in routes()
                 if issubclass(handler, (OpenAIHandler, AnthropicHandler))}
OLLAMA_SHAPED = {pattern.lstrip("/") for pattern, handler in routes() if issubclass(handler, OllamaHandler)}


def concrete(pattern: str, arg: str) -> str:
    """A path the pattern matches: each group, or a catch-all ``.*``, is ``arg``."""
    return re.sub(r"\([^)]*\)|\.\*$", arg, pattern)


@pytest.mark.parametrize(("method", "pattern"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_no_input_makes_a_route_fail_or_hang(http: httpx.Client, method: str, pattern: str) -> None:
    fields = POST_FIELDS.get(pattern, {"prompt", "max_tokens", "id", "model", "text", "tokens", "messages"})
    catch_all = pattern.endswith("/.*")  # the JSON 404 of unknown paths: fewer examples

    @settings(FUZZ, max_examples=EXAMPLES // 5 if catch_all else EXAMPLES)
    @given(body=bodies(fields, VALID_BODIES.get(pattern)), query=QUERY, arg=PATH_ARG)
    def one(body: bytes, query: str, arg: str) -> None:
        path = concrete(pattern, arg) + ("" if method == "POST" else "?" + query)
        send(http, method, path, pattern, pattern in OPENAI_SHAPED, body if method in ("POST", "PUT", "PATCH") else None)

    one()
    assert http.get("infer/status").status_code == 200  # and it still serves


def test_report_what_was_sent() -> None:
    """Not a check: prints the counts for the record (run with ``-s``)."""
    print("\nfuzz:", dict(sorted(SEEN.items())))
    assert not SEEN["5xx"]
