"""``make_service``: the service a configuration asks for, one engine's or a router's.

Apart from ``inference`` and ``router`` so that neither imports the other to build one.
"""

from __future__ import annotations

from ..values.config import ServiceConfig
from .inference import InferenceService
from .protocol import Service
from .router import RouterService


def make_service(config: ServiceConfig) -> Service:
    """An ``InferenceService``, or a ``RouterService`` for ``engine = "router"``."""
    if config.engine == "router":
        return RouterService(config)
    return InferenceService(config)
