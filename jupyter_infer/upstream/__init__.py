"""``engine = "openai"``: an upstream OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp,
Ray Serve, another jupyter_infer) behind this server's queue, priorities, cancellation,
metrics and timeline.

``connection``: the upstream as seen from here (``UpstreamServer``: model, reachability,
streams with retries); ``admission``: who may send to it now (``UpstreamAdmission``: the same
``RequestQueue`` and fair share as the engine's scheduler, beside it, not inside it). The loop that runs them is ``loops.upstream_loop``; the
request and chunk formats are ``wire.upstream_openai``.
"""

from .connection import UpstreamServer

__all__ = ["UpstreamServer"]
