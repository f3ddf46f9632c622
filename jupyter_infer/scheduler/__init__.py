"""Scheduling: the sync core that decides (``Scheduler``), the async loop that runs its plans
on the engine thread (``EngineLoop``), and the recorder of what happened."""

from .loop import EngineLoop
from .recorder import Recorder
from .scheduler import Scheduler

__all__ = ["EngineLoop", "Recorder", "Scheduler"]
