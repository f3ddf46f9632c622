"""Per-row sampling: penalties, bias, min_tokens and log probabilities, on plain tensors."""

from __future__ import annotations

import math

import pytest
import torch

from jupyter_infer.decoding.sampling import RowSampler, filter_logits, prompt_logprobs, sample
from jupyter_infer.values.request import SamplingParams

EOS = 0


def row(prompt: list[int], output: list[int] = (), **params) -> RowSampler:
    """A row's sampler, as the engine builds it at prefill, after ``output`` was kept."""
    sampler = RowSampler.build(SamplingParams(max_tokens=16, **params), list(prompt), frozenset({EOS}))
    sampler.advance(list(output))
    return sampler


def test_plain_rows_are_argmax_and_carry_no_logprobs() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0], [5.0, 1.0, 0.0, 0.0]])
    out = sample(logits, [row([1]), row([2])])
    assert [o.tokens for o in out] == [[2], [0]] and all(o.logprobs is None and o.prompt_logprobs is None for o in out)


def test_logit_bias_and_min_tokens_steer_the_choice() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0, 0.0]] * 3)
    seqs = [row([1]), row([1], logit_bias=((3, 100.0),)), row([1], min_tokens=2)]
    out = sample(logits, seqs)
    assert [o.tokens for o in out] == [[EOS], [3], [1]]  # EOS is masked until min_tokens exist
    seqs[2].advance([1])  # it kept the token it was given, and one more: min_tokens are there
    assert [o.tokens for o in sample(logits[2:], seqs[2:])] == [[EOS]]


def test_penalties_follow_vllm() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    rep = row([0], [1], repetition_penalty=2.0).shape(logits)
    assert rep.tolist() == [1.0, -4.0, 1.0, 0.5]  # seen tokens: positive / p, negative * p
    freq = row([0], [2, 2, 3], frequency_penalty=0.5, presence_penalty=0.25).shape(logits)
    # The prompt does not count for frequency/presence; output token 2 twice, 3 once.
    assert freq.tolist() == [2.0, -2.0, 1.0 - 1.0 - 0.25, 0.5 - 0.5 - 0.25]
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.5]  # the batch's logits are untouched


def test_top_p_zero_keeps_the_best_token() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0])
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.0))
    assert torch.isfinite(kept).tolist() == [False, True, False]


def test_logprobs_are_the_raw_log_softmax_and_only_for_rows_that_ask() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    seqs = [row([1], logprobs=3), row([1]), row([1], logprobs=0, logit_bias=((7, 100.0),))]
    out = sample(logits, seqs)
    expected = torch.log_softmax(logits, -1)
    assert out[1].logprobs is None
    [first] = out[0].logprobs
    assert first.token_id == out[0].tokens[0] == int(logits[0].argmax())
    assert first.logprob == pytest.approx(float(expected[0].max()))
    assert [t for t, _ in first.top] == expected[0].topk(3).indices.tolist()
    # The bias chose token 7, but its logprob is the model's own (vLLM's raw logprobs).
    [third] = out[2].logprobs
    assert third.token_id == 7 and third.top == ()
    assert third.logprob == pytest.approx(float(expected[2, 7]))


def test_prompt_logprobs_score_each_next_token() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 10)  # one row per prompt position
    prompt = [3, 1, 4, 1]
    records = prompt_logprobs(logits, prompt, 2)
    assert records[0] is None and len(records) == 4
    lp = torch.log_softmax(logits, -1)
    for j in range(1, 4):
        assert records[j].token_id == prompt[j]
        assert records[j].logprob == pytest.approx(float(lp[j - 1, prompt[j]]))
        assert len(records[j].top) == 2 and math.isclose(records[j].top[0][1], float(lp[j - 1].max()), rel_tol=1e-6)


def test_ignored_openai_fields_are_logged_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    from jupyter_infer.wire import openai_requests

    caplog.set_level("INFO", logger=openai_requests.__name__)
    allowed = openai_requests.COMPLETION_FIELDS
    assert openai_requests.ignored_fields({"prompt": "x", "zz_vendor": 1, "zz_other": 2}, allowed) == ["zz_other", "zz_vendor"]
    assert openai_requests.ignored_fields({"zz_vendor": 3}, allowed) == ["zz_vendor"]
    logged = [r.getMessage() for r in caplog.records if "zz_" in r.getMessage()]
    assert len(logged) == 2  # one line per name, however often it comes
