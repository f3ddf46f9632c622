"""Bad input is refused with a message that says what to fix."""

from __future__ import annotations

import pytest

from jupyter_infer.decoding.logits_processors import processors_for
from jupyter_infer.errors import InvalidRequest
from jupyter_infer.wire.fields import parse_generate_body


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "   "}, "empty"),
        ({"prompt": 3}, "must be a string"),
        ({}, "must be a string"),
        ({"prompt": "hi", "max_tokens": -1}, "integer from 0 to 256"),
        ({"prompt": "hi", "max_tokens": "10"}, "integer from 0 to 256"),
        ({"prompt": "hi", "temperature": 3}, "'temperature' must be between 0.0 and 2.0"),
        ({"prompt": "hi", "temperature": -0.1}, "temperature"),
        ({"prompt": "hi", "top_p": 1.5}, "top_p"),
        ({"prompt": "hi", "top_k": -5}, "top_k"),
        ({"prompt": "hi", "seed": "x"}, "seed"),
        ({"prompt": "hi", "stop": [3]}, "stop"),
        ({"prompt": "hi", "stop": [f"s{i}" for i in range(65)]}, "at most 64"),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, "above 'max_tokens'"),
        ({"prompt": "hi", "repetition_penalty": 11}, "repetition_penalty"),
        ({"prompt": "hi", "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"prompt": "hi", "ignore_eos": "yes"}, "true or false"),
        ({"prompt": "hi", "logit_bias": {"x": 1}}, "token ids"),
        ({"prompt": "hi", "logit_bias": {"5": 101}}, "-100 to 100"),
        ({"prompt": "hi", "priority": 1.5}, "priority"),
        ({"prompt": "hi", "frobnicate": True}, "Unknown field"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_bad_bodies_are_refused_with_a_clear_message(body, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as err:
        parse_generate_body(body, max_new_tokens=256)
    assert err.value.status == 400


def test_good_body_becomes_a_request() -> None:
    r = parse_generate_body(
        {"prompt": "hi", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7,
         "stop": "\n", "priority": 2},
        max_new_tokens=256,
    )
    assert r.prompt == "hi" and r.priority == 2
    assert (r.params.max_tokens, r.params.temperature, r.params.top_k, r.params.seed) == (5, 0.5, 40, 7)
    assert r.params.stop == ("\n",) and not r.params.greedy


def test_sampling_extras_and_neutral_values_are_accepted() -> None:
    r = parse_generate_body(
        {"prompt": "hi", "max_tokens": 0, "top_p": 0, "top_k": -1, "min_tokens": 0, "ignore_eos": True,
         "repetition_penalty": 0, "frequency_penalty": 0.0, "presence_penalty": 0,
         "logit_bias": {"7": 0, "9": -100}, "stop": [f"s{i}" for i in range(64)] + [""]},
        max_new_tokens=256,
    )
    p = r.params
    assert (p.max_tokens, p.top_p, p.top_k, p.ignore_eos) == (0, 0.0, 0, True)
    assert p.logit_bias == ((9, -100.0),) and len(p.stop) == 64
    # Only the bias that is not neutral shapes a row's logits (the engine's processors).
    assert [type(x).__name__ for x in processors_for(p, [1], {0})] == ["LogitBias"] and p.repetition_penalty == 1.0
