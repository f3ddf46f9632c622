"""engine = "openai"'s wire format without I/O (``wire/upstream_openai.py``): what goes
upstream, what comes back, and its errors as ours."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import InvalidRequest, UpstreamError, UpstreamUnavailable
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.wire.upstream_openai import (
    error_message,
    estimate_tokens,
    http_error,
    parse_chunk,
    request_body,
)

URL = "http://upstream.test/v1"


def test_a_chat_goes_upstream_as_a_chat_and_default_knobs_stay_out() -> None:
    chat = Request("", SamplingParams(max_tokens=5), messages=[{"role": "user", "content": "hi"}])
    path, body = request_body(chat, "m")
    assert path == "chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "messages": body["messages"], "max_tokens": 5, "temperature": 0.0}
    plain = Request("Once", SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=40, seed=3,
                                           stop=("\n", "END")))
    path, body = request_body(plain, "m")
    assert path == "completions" and body["prompt"] == "Once"
    assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")} == {
        "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n", "END"]}


def test_chunks_of_completions_chats_and_usage() -> None:
    assert parse_chunk('{"choices": [{"text": "ab", "finish_reason": null}]}').text == "ab"
    chat = parse_chunk('{"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]}')
    assert (chat.text, chat.finish_reason) == ("x", "length")
    role = parse_chunk('{"choices": [{"delta": {"role": "assistant"}}]}')
    assert role.text == "" and not role.has_usage
    usage = parse_chunk('{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}}')
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 9)
    assert parse_chunk("[DONE]") is None
    with pytest.raises(UpstreamError, match="out of memory"):
        parse_chunk('{"error": {"message": "CUDA out of memory", "type": "server_error"}}')
    with pytest.raises(UpstreamError, match="not JSON"):
        parse_chunk("<html>")


def test_upstream_errors_become_ours_with_its_message() -> None:
    assert error_message(b'{"error": {"message": "bad model"}}') == "bad model"
    assert error_message('{"detail": "Unexpected fields: top_k"}') == "Unexpected fields: top_k"
    assert error_message("{\"error\": \"overloaded\"}") == "overloaded"
    assert error_message(b"Bad Gateway") == "Bad Gateway"
    assert isinstance(http_error(500, b'{"error": "boom"}', URL), UpstreamError)
    busy = http_error(503, b"{}", URL, retry_after="2")
    assert isinstance(busy, UpstreamUnavailable) and busy.retry_after == 2.0
    refused = http_error(422, b'{"detail": "Unexpected fields: top_k"}', URL)
    assert isinstance(refused, InvalidRequest) and "top_k" in refused.message
    assert "upstream_api_key" in http_error(401, b"{}", URL).message
    assert "ending in /v1" in http_error(404, b"{}", URL).message


def test_prompt_size_is_estimated_for_limits_and_rules() -> None:
    assert estimate_tokens(Request("x" * 400)) == 100
    chat = Request("", messages=[{"role": "user", "content": "x" * 40}, {"role": "user", "content": ""}])
    assert estimate_tokens(chat) == 10 + 4 + 4
