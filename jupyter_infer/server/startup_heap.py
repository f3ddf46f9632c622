"""Short full garbage collections in the server's process.

A full (generation 2) collection walks every object Python tracks, and every thread waits for
it: Jupyter's event loop, the token streams, the engine thread. With torch, transformers and
jupyter_server imported that is half a million objects, about 0.25 s on a 2-core CPU, and a
process that has run a while holds more (1.3 s stalls of Jupyter's ``api/status`` were seen
this way). Almost all of them live as long as the process: the modules, the model.

So once the engine is ready, what is alive is frozen (``gc.freeze``: moved to a permanent
generation that no collection walks), and later full collections walk only what came after.
One full collection runs first, as vLLM's ``freeze_gc_heap`` does: garbage frozen with the
rest could never be reclaimed (a cycle holding a tensor from the load would hold it for good).
The engine loop runs it after the load, before it says it is ready, so that it does not stall
the first requests (an upstream service loads no model: nothing worth a collection).
When the service stops, the heap is thawed (``gc.unfreeze``), so that what the stopped service
leaves behind can be collected. The kernel side never freezes: that heap is the user's.
"""

from __future__ import annotations

import gc
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class _Ready(Protocol):
    async def wait_ready(self, timeout: float | None = None) -> object: ...


async def freeze_when_ready(service: _Ready) -> bool:
    """Freeze the heap once ``service`` is ready; False if it failed to load."""
    try:
        await service.wait_ready()
    except Exception:
        return False
    gc.freeze()
    log.debug("jupyter_infer: %d objects frozen (gc.freeze) once the engine was ready", gc.get_freeze_count())
    return True


def thaw() -> None:
    """The service stopped: its objects may be collected again."""
    gc.unfreeze()
