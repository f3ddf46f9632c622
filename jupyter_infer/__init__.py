"""jupyter_infer: an LLM inference server inside Jupyter.

Server side: the ``InferApp`` extension (``jupyter_infer.server``). Kernel side:
``%load_ext jupyter_infer`` and the names below (``Client``, the widgets, the agents, the
local server). The package's floors are drawn in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

# Kernel-side names, imported on first use: importing the package (the server does, at start)
# must not pull in the client or ipywidgets.
_LAZY = {
    "Client": "kernel.client",
    "InferPanel": "kernel.widgets",
    "BatchTimeline": "kernel.widgets",
    "RunSummary": "kernel.widgets",
    "run_agents": "kernel.agents",
    "search_tool": "kernel.agents",
    "run_tool_agent": "kernel.tool_agent",
    "LocalServer": "kernel.launcher",
}
__all__ = [*_LAZY, "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .server.app import InferApp

    return [{"module": "jupyter_infer.server.app", "app": InferApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension (for ``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "jupyter-infer"}]


def load_ipython_extension(ipython: Any) -> None:
    from .kernel.magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'jupyter_infer' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
