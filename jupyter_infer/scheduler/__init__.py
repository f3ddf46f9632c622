"""Scheduling: the sync core that decides (``Scheduler``), the async loop that runs its plans
on the engine thread (``EngineLoop``), the recorder of what happened, and the per-request
``Sequence`` and ``RequestStream``."""

from .loop import EngineLoop
from .recorder import Recorder
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .stream import RequestStream

__all__ = ["EngineLoop", "Recorder", "RequestStream", "Scheduler", "Sequence", "Status"]
