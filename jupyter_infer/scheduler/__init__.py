"""Scheduling, synchronous and free of I/O: the core that decides which sequences run in the
next step (``Scheduler``), the queue every core keeps its requests in (``RequestQueue``: limits,
the owners' fair order from ``fair``, every request's end), and the recorder of what happened
(``Recorder``). The async loop that runs the plans is ``loops.engine_loop``."""

from .recorder import Recorder
from .request_queue import RequestQueue
from .scheduler import Scheduler

__all__ = ["Recorder", "RequestQueue", "Scheduler"]
