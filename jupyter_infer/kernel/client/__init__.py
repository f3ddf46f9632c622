"""``jupyter_infer.Client``: the kernel side's way to the inference engine, sync and async.

One concern per module:

- ``api``: ``Client`` (generate, stream, burst, cancel, status, metrics, batches) and the
  process's default client;
- ``discovery``: where requests go (explicit, environment, this kernel's server, or embedded);
- ``backend``: the ``Backend`` protocol that both backends implement;
- ``http``: the server backend (httpx, httpx-sse; timeouts so that nothing hangs);
- ``embedded``: an ``InferenceService`` in this process;
- ``openai_backend``: a plain OpenAI-compatible server (vLLM, TGI, ...), client-side timings;
- ``streams``: ``TokenStream``/``AsyncTokenStream``;
- ``io_thread``: the I/O thread whose event loop runs every request;
- ``results``: ``Completion``; ``arrivals``: ``arrival_times`` (Poisson arrivals).
"""

from __future__ import annotations

from .api import Client, default_client, set_default_client
from .arrivals import arrival_times
from .backend import Accepted, Backend, Final, Fragment
from .discovery import ENV_TOKEN, ENV_URL, Connection, discover, find_kernel_server
from .results import Completion
from .streams import AsyncTokenStream, TokenStream

__all__ = [
    "ENV_TOKEN", "ENV_URL", "Accepted", "AsyncTokenStream", "Backend", "Client", "Completion", "Connection", "Final", "Fragment",
    "TokenStream", "arrival_times", "default_client", "discover", "find_kernel_server", "set_default_client",
]
