"""``make_service``: the service a configuration asks for, one engine's or a router's.

Above both ``service.py`` and ``router/``, so neither imports the other to build one.
"""

from __future__ import annotations

from .config import ServiceConfig
from .protocol import Service
from .router import RouterService
from .service import InferenceService


def make_service(config: ServiceConfig) -> Service:
    """An ``InferenceService``, or a ``RouterService`` for ``engine = "router"``."""
    if config.engine == "router":
        return RouterService(config)
    return InferenceService(config)
