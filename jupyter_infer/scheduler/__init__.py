"""Scheduling, synchronous and engine-free of I/O: the core that decides which sequences run in
the next step (``Scheduler``), the owners' fair order (``fair``), and the recorder of what
happened (``Recorder``). The async loop that runs its plans is ``loops.engine_loop``."""

from .recorder import Recorder
from .scheduler import Scheduler

__all__ = ["Recorder", "Scheduler"]
