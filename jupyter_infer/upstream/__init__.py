"""``engine = "openai"``: an upstream OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp,
Ray Serve, another jupyter_infer) behind this server's queue, priorities, cancellation,
metrics and timeline.

``UpstreamServer`` is the upstream as seen from here (model, reachability, streams with
retries); ``UpstreamLoop`` runs the front's scheduling core in front of it; ``wire`` holds the
request and chunk formats.
"""

from .loop import UpstreamLoop
from .server import UpstreamServer
from .wire import estimate_tokens

__all__ = ["UpstreamLoop", "UpstreamServer", "estimate_tokens"]
