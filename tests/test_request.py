"""Bad input is refused with a message that says what to fix."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import InvalidRequest
from jupyter_infer.request import parse_generate_body


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "   "}, "empty"),
        ({"prompt": 3}, "must be a string"),
        ({}, "must be a string"),
        ({"prompt": "hi", "max_tokens": -1}, "positive integer"),
        ({"prompt": "hi", "max_tokens": 0}, "positive integer"),
        ({"prompt": "hi", "max_tokens": "10"}, "positive integer"),
        ({"prompt": "hi", "temperature": 3}, "'temperature' must be between 0.0 and 2.0"),
        ({"prompt": "hi", "temperature": -0.1}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "top_k": -5}, "top_k"),
        ({"prompt": "hi", "seed": "x"}, "seed"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
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
