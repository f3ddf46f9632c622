"""engine = "router"'s rule without I/O (``service/routing.py``): which backend a request
goes to, and the configuration errors that name the option."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import InvalidRequest, RequestFailed
from jupyter_infer.service.routing import Rule
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

URL = "http://upstream.test/v1"

BACKENDS = {"local": {"engine": "simulated"}, "cluster": {"engine": "openai", "upstream_url": URL}}


def rule(**config) -> Rule:
    cfg = ServiceConfig(engine="router", router_backends=BACKENDS, **config)
    return Rule(cfg, cfg.backend_configs())


SERVED = {"local": ["local", "simulated"], "cluster": ["cluster", "big-model"]}


def pick(r: Rule, prompt: str = "hi", max_tokens: int = 16, model: str | None = None):
    return r.pick(Request(prompt, SamplingParams(max_tokens=max_tokens), model=model), SERVED)


def test_the_named_model_comes_first_and_never_falls_back() -> None:
    r = rule(router_fallback={"cluster": "local"})
    assert pick(r, model="big-model").backend == "cluster"
    decision = pick(r, "x" * 10_000, model="local")
    assert (decision.backend, decision.reason, decision.fallback) == ("local", "model", None)
    with pytest.raises(InvalidRequest, match="not served here"):
        pick(r, model="gpt-5")


def test_complexity_sends_long_prompts_and_long_answers_to_the_cluster() -> None:
    r = rule(router_complex_prompt_tokens=100, router_complex_max_tokens=200, router_fallback={"cluster": "local"})
    assert pick(r).backend == "local"  # the default: the first backend
    long_prompt = pick(r, "x" * 400)
    assert (long_prompt.backend, long_prompt.reason, long_prompt.fallback) == ("cluster", "complexity", "local")
    assert pick(r, max_tokens=200).backend == "cluster"


def test_sensitive_content_stays_local_whatever_else_it_is() -> None:
    r = rule(router_sensitive_patterns=[r"\bpatient\b", r"\d{3}-\d{2}-\d{4}"], router_complex_prompt_tokens=10,
             router_default="cluster", router_fallback={"local": "cluster"})
    decision = pick(r, "The PATIENT record " + "x" * 100)
    assert (decision.backend, decision.reason) == ("local", "sensitivity")
    assert decision.fallback is None  # its fallback is outside this process
    assert pick(r, "my number is 123-45-6789").backend == "local"
    assert pick(r, "nothing to hide").backend == "cluster"
    with pytest.raises(InvalidRequest, match="must stay in this process"):
        pick(r, "patient notes", model="cluster")


def test_a_callable_policy_decides_in_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    module = types.ModuleType("my_routes")
    module.by_word = lambda request, prompt_tokens: "cluster" if "deep" in request.prompt else None
    module.nonsense = lambda request, prompt_tokens: "mars"
    monkeypatch.setitem(__import__("sys").modules, "my_routes", module)
    r = rule(router_policies=["my_routes:by_word", "complexity"])
    assert pick(r, "a deep question").reason == "callable my_routes:by_word"
    assert pick(r, "a shallow one").backend == "local"
    with pytest.raises(RequestFailed, match="'mars', which is not a backend"):
        pick(rule(router_policies=["my_routes:nonsense"]))
    with pytest.raises(ValueError, match="cannot import"):
        rule(router_policies=["my_routes:missing"])


def test_router_configuration_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="router_backends is empty"):
        ServiceConfig(engine="router")
    with pytest.raises(ValueError, match=r"router_backends\['cluster'\]: InferApp.upstream_url"):
        ServiceConfig(engine="router", router_backends={"cluster": {"engine": "openai"}})
    with pytest.raises(ValueError, match="router_fallback"):
        ServiceConfig(engine="router", router_backends=BACKENDS, router_fallback={"cluster": "moon"})
    with pytest.raises(ValueError, match="not a regular expression"):
        ServiceConfig(engine="router", router_backends=BACKENDS, router_sensitive_patterns=["(unclosed"])
