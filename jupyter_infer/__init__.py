"""jupyter_infer: an LLM inference server inside Jupyter.

Server side: the ``InferApp`` extension (``jupyter_infer.server``). Kernel side:
``%load_ext jupyter_infer`` and ``jupyter_infer.Client``.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["Client", "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .server.app import InferApp

    return [{"module": "jupyter_infer.server.app", "app": InferApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension (for ``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "jupyter-infer"}]


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (the server does, at start) must not pull in the client.
    if name == "Client":
        from .client import Client

        return Client
    raise AttributeError(name)
