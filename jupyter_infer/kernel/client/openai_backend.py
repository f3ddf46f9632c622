"""The plain-OpenAI backend: ``Client(url="http://vllm:8000/v1", api_key=...)`` talks to any
OpenAI-compatible server directly (vLLM, TGI, SGLang, llama.cpp, ...), no Jupyter server in
between.

It runs the ``engine = "openai"`` front in this process, on the client's I/O loop: the same
queue, cancellation, metrics and span records that a jupyter_infer server in front of that
upstream keeps, seen from the client. So the magics, the panel, the burst timeline and the
agent helper work unchanged. What they show are **client-side timings**: the upstream's own
queue and batches are invisible from here, a "batch" is a set of this client's requests in
flight together, and ``status``, ``metrics`` and ``batches`` say so (``"timings":
"client-side"``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from .embedded import EmbeddedBackend

# The upstream enforces its own context and limits; the client's front only queues.
CLIENT_MAX_NEW_TOKENS = 131_072
CLIENT_MAX_PROMPT_TOKENS = 1_048_576
CLIENT_TIMINGS = "client-side"
NOTE = ("timings measured by this client: a batch is a set of this client's requests in flight "
        "upstream together; the upstream's own queue and batches are not visible from here")


def is_openai_url(url: str | None) -> bool:
    """An OpenAI base URL (``.../v1``), not a Jupyter server's."""
    return bool(url) and urlparse(url.strip()).path.rstrip("/").endswith("/v1")


class OpenAIBackend(EmbeddedBackend):
    """``Backend`` for a plain OpenAI-compatible server at ``url`` (its base URL, ``.../v1``).

    ``model``: the model to ask for (default: the first of its ``v1/models``);
    ``max_in_flight``: this client's requests running upstream at once (the rest wait here,
    highest ``priority`` first); ``timeout``: how long the upstream may stay silent.
    """

    def __init__(self, url: str, api_key: str | None = None, *, model: str | None = None,
                 max_in_flight: int = 64, timeout: float = 300.0) -> None:
        from ...service.inference import InferenceService
        from ...values.config import ServiceConfig

        config = ServiceConfig(
            engine="openai", upstream_url=url.strip(), upstream_api_key=api_key or "",
            upstream_model=model or "", upstream_timeout_s=timeout, max_batch_size=max_in_flight,
            max_new_tokens=CLIENT_MAX_NEW_TOKENS, max_prompt_tokens=CLIENT_MAX_PROMPT_TOKENS,
        )
        super().__init__(InferenceService(config))
        self.url = config.upstream_url  # the key stays in the service's HTTP client only

    @staticmethod
    def _label(answer: dict[str, Any]) -> dict[str, Any]:
        return {**answer, "timings": CLIENT_TIMINGS, "timings_note": NOTE}

    async def status(self) -> dict[str, Any]:
        return self._label(await super().status())

    async def metrics(self) -> dict[str, Any]:
        return self._label(await super().metrics())

    async def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        return self._label(await super().batches(limit, requests))

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        return self._label(await super().wait_ready(timeout))
