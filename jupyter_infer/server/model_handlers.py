"""``infer/models``: what this machine can serve, which model is loaded, and loading or
unloading one at run time (``service/model_shelf.py``), without restarting Jupyter.

``GET`` lists (any authorized user); ``POST {"model": ..., "quantize": ...}`` loads one in
place of the loaded model and answers once it is ready (or 503 saying why it could not load);
``DELETE`` unloads. On a shared server only an admin (``InferApp.admin_users``, a hub admin)
may load or unload: it changes the model for everyone.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import Forbidden, InvalidRequest
from .handler_base import GENERATE, InferHandler, answers_errors


class ModelsHandler(InferHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        self.finish(self._answer())

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"].strip():
            raise InvalidRequest('Send {"model": "<a listed id, a folder, a .gguf file or a Hub id>"} '
                                 '(and optionally "quantize", "dtype", "device", "num_threads").', param="model")
        shelf = self._shelf()
        options = {k: v for k, v in body.items() if k != "model"}
        await shelf.load(body["model"], **options)
        self.finish(self._answer())

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def delete(self) -> None:
        await self._shelf().unload()
        self.finish(self._answer())

    def _shelf(self) -> Any:
        if not self.viewer.sees_all:
            raise Forbidden("Loading or unloading a model changes it for every user of this server: "
                            "only an admin may (InferApp.admin_users, or a JupyterHub admin).")
        shelf = getattr(self.service, "models", None)
        if shelf is None:
            raise InvalidRequest("This server routes to several backends: their models are set in "
                                 "InferApp.router_backends.")
        return shelf

    def _answer(self) -> dict[str, Any]:
        shelf = getattr(self.service, "models", None)
        if shelf is None:  # a router: its backends' models, none to load here
            return {"state": self.service.state, "model": None, "models": [], "load_on_demand": False,
                    "unload_after_s": 0}
        return shelf.answer()
