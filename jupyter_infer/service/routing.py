"""The router's rule: which backend serves a request. Pure decisions, no I/O.

In this order (docs/scale-out.md says the same):

1. **The model the request names.** A backend's name (``"model": "cluster"``) or a model one
   of them serves picks that backend; such a request never falls back to another model.
   ``"default"`` or no model goes on to the policies. (One exception: with the
   ``sensitivity`` policy on, a request whose text matches a sensitive pattern and that names
   a backend outside this process is refused with 400: that content stays here.)
2. **The policies**, in the order of ``InferApp.router_policies``; the first that decides wins:

   - ``sensitivity``: a prompt (or any chat message) matching one of
     ``router_sensitive_patterns`` (regular expressions, case-insensitive) goes to
     ``router_private_backend`` — by default the first backend that runs in this process —
     and may only fall back to a backend that runs in this process too;
   - ``complexity``: a prompt of at least ``router_complex_prompt_tokens`` (estimated:
     four characters a token) or a request for at least ``router_complex_max_tokens``
     tokens goes to ``router_complex_backend`` — by default the first ``openai`` backend;
   - ``module:function``: a callable ``f(request, prompt_tokens) -> backend name | None``.
3. **``router_default``** (the first backend unless set).

If the chosen backend fails before its first token (unreachable, overloaded, queue full),
the request goes to ``router_fallback[backend]`` when that is set.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest, RequestFailed
from ..values.config import LOCAL_ENGINES
from ..wire.upstream_openai import estimate_tokens

if TYPE_CHECKING:
    from ..values.config import ServiceConfig
    from ..values.request import Request

Policy = Callable[["Request", int], "str | None"]


@dataclass(frozen=True)
class Decision:
    backend: str
    reason: str  # "model", "sensitivity", "complexity", "callable <name>" or "default"
    fallback: str | None  # where it goes if the backend fails before its first token


class Rule:
    def __init__(self, config: ServiceConfig, backends: Mapping[str, ServiceConfig]) -> None:
        names = list(backends)
        local = [n for n in names if backends[n].engine in LOCAL_ENGINES]
        remote = [n for n in names if backends[n].engine == "openai"]
        self.backends = names
        self.local = set(local)
        self.default = config.router_default or names[0]
        self.private = config.router_private_backend or (local[0] if local else None)
        self.complex = config.router_complex_backend or (remote[0] if remote else None)
        self.complex_prompt_tokens = config.router_complex_prompt_tokens
        self.complex_max_tokens = config.router_complex_max_tokens
        self.fallback = dict(config.router_fallback)
        self.patterns = [re.compile(p, re.IGNORECASE) for p in config.router_sensitive_patterns]
        self.policies: list[tuple[str, Policy]] = [(name, self._policy(name)) for name in config.router_policies]

    def _policy(self, name: str) -> Policy:
        if name == "sensitivity":
            return self._sensitivity
        if name == "complexity":
            return self._complexity
        module, _, function = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"InferApp.router_policies: cannot import {name!r} ({type(err).__name__}: {err})."
            ) from None
        if not callable(fn):
            raise ValueError(f"InferApp.router_policies: {name!r} is not callable.")
        return fn

    # -- the decision -----------------------------------------------------------------------
    def pick(self, request: Request, served: Mapping[str, list[str]]) -> Decision:
        """The backend for ``request``; ``served`` names what each backend answers to (its
        name first, then its model's names). Raises ``InvalidRequest`` for a model nobody
        serves, ``RequestFailed`` for a callable that answers nonsense."""
        if request.model not in (None, "default"):
            for backend, names in served.items():
                if request.model in names:
                    if backend not in self.local and "sensitivity" in dict(self.policies) \
                            and self._sensitivity(request, 0) is not None:
                        raise InvalidRequest(
                            f"This request matches a sensitive pattern (InferApp.router_sensitive_patterns), "
                            f"so it must stay in this process; it cannot go to {backend!r}. Leave out "
                            f"'model' or name {self.private!r}.", param="model",
                        )
                    return Decision(backend, "model", None)
            every = sorted({n for names in served.values() for n in names})
            raise InvalidRequest(
                f"The model {request.model!r} is not served here; use one of {', '.join(every)} "
                "(see GET infer/v1/models).", param="model",
            )
        prompt_tokens = estimate_tokens(request)
        for name, policy in self.policies:
            try:
                backend = policy(request, prompt_tokens)
            except Exception as err:
                raise RequestFailed(f"The router's policy {name!r} failed: {type(err).__name__}: {err}") from None
            if backend is None:
                continue
            if backend not in served:
                raise RequestFailed(
                    f"The router's policy {name!r} chose {backend!r}, which is not a backend "
                    f"({', '.join(self.backends)})."
                )
            reason = name if name in ("sensitivity", "complexity") else f"callable {name}"
            return Decision(backend, reason, self._fallback(backend, private=name == "sensitivity"))
        return Decision(self.default, "default", self._fallback(self.default, private=False))

    def _fallback(self, backend: str, *, private: bool) -> str | None:
        target = self.fallback.get(backend)
        if private and target not in self.local:
            return None  # sensitive content never leaves this process
        return target

    def _sensitivity(self, request: Request, prompt_tokens: int) -> str | None:
        if not self.patterns or self.private is None:
            return None
        texts = [m["content"] for m in request.messages] if request.messages is not None else [request.prompt]
        if any(p.search(text) for p in self.patterns for text in texts):
            return self.private
        return None

    def _complexity(self, request: Request, prompt_tokens: int) -> str | None:
        if self.complex is None:
            return None
        max_tokens = request.params.max_tokens or 0
        if prompt_tokens >= self.complex_prompt_tokens or max_tokens >= self.complex_max_tokens:
            return self.complex
        return None

    def describe(self) -> dict[str, Any]:
        """The rule as ``status`` shows it."""
        return {
            "order": ["model", *[name for name, _ in self.policies], "default"],
            "default": self.default,
            "sensitivity": {"backend": self.private, "patterns": [p.pattern for p in self.patterns]},
            "complexity": {"backend": self.complex, "prompt_tokens": self.complex_prompt_tokens,
                           "max_tokens": self.complex_max_tokens},
            "fallback": self.fallback,
        }
