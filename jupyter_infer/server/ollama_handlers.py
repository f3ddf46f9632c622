"""Ollama's API under ``<base_url>infer/api/``: the same service, bodies translated and answers
read by ``wire/ollama_api`` and rendered by ``wire/ollama_answers`` (chat, generate) and ``wire/ollama_models`` (tags, show, ps,
version), errors as Ollama's ``{"error": "..."}``, a late one as the stream's last line.

Auth is Jupyter's, as on every route: the token as ``Authorization: Bearer <token>`` (the
``ollama`` client's ``headers=``, or its ``OLLAMA_API_KEY``). Models come from the catalog the
model shelf reads; ``pull``, ``push``, ``create``, ``copy`` and ``delete`` say where models come
from instead. ``keep_alive: 0`` unloads the model through the shelf once nothing else runs on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import Forbidden, InferError, InvalidRequest, NotFound
from ..values.engine_info import EngineInfo
from ..values.request import RequestResult, TokenEvent, show
from ..values.stream import RequestStream
from ..wire import ollama_answers, ollama_api, ollama_embed, ollama_models
from ..wire.ollama_models import ModelFacts
from .embedding_handlers import results_of, without_gzip
from .handler_base import GENERATE, InferHandler, answers_errors

log = logging.getLogger(__name__)
INVALID_KEY = ("Missing or invalid token: send this Jupyter server's token as 'Authorization: Bearer <token>' "
               "(the ollama client: headers={'Authorization': 'Bearer <token>'}, or OLLAMA_API_KEY=<token>).")
UNLOAD_WAIT_S = 10.0  # how long keep_alive 0 waits for others' requests on the model to end
NO_STORE = ("{what} is not supported here: jupyter_infer serves the models already on this machine (GET "
            "api/tags lists them): Ollama's own store (~/.ollama/models, OLLAMA_MODELS), the Hugging Face "
            "cache ('hf download <repo>'), and the folders of InferApp.model_dirs; 'jupyter infer make-model' "
            "builds a small one. Use Ollama itself to {verb} models.")


class OllamaHandler(InferHandler):
    """Errors in Ollama's ``{"error": message}``, for what we raise and what tornado and
    jupyter_server raise (401 for a missing or wrong token, 404, 405); a stream is NDJSON."""

    unauthorized = INVALID_KEY

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.keepalive_s = 86400.0  # NDJSON has no comment line: no keepalives between objects

    def no_user_is_401(self) -> bool:
        return True

    def get_login_url(self) -> str:
        raise web.HTTPError(401, INVALID_KEY)  # what @web.authenticated asks for without a user

    def error_body(self, err: InferError) -> dict[str, Any]:
        return ollama_answers.error_json(err.message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.count_refusal(status_code)
        message = self.refusal_message(status_code, kwargs.get("exc_info", (None, None))[1])
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(ollama_answers.error_json(message)))

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:  # a late error is the stream's last line
            self.write(ollama_answers.ndjson([ollama_answers.error_json(err.message)]))
            self.finish_lines()
            return
        super().write_infer_error(err)

    def finish_lines(self) -> None:
        if not self._finished:
            self.finish(set_content_type="application/x-ndjson")

    # -- the models -------------------------------------------------------------------------
    @property
    def shelf(self) -> Any:
        return getattr(self.service, "models", None)

    def loaded_info(self) -> EngineInfo | None:
        """The loaded model's info (``None``: none is loaded now)."""
        shelf = self.shelf
        if self.service.state != "ready" or (shelf is not None and shelf.unloaded):
            return None
        return self.service.info

    async def model_facts(self) -> list[ModelFacts]:
        """Every model this server can serve (the loaded one first), with what is known of it."""
        info = self.loaded_info()
        shelf = self.shelf
        listed = await asyncio.to_thread(shelf.listing) if shelf is not None else []
        if not listed and self.service.info is not None:  # an upstream's or a router's models
            served = self.service.info
            cards = [{"id": served.model, "route": None}, *served.models]
            listed = [{"id": c["id"], "path": c["id"], "source": "served", "size_bytes": 0,
                       "loaded": info is not None and c["id"] == served.model} for c in cards]
        return [_facts(entry, self.info_of(str(entry.get("path") or entry["id"])) if entry.get("loaded") else None)
                for entry in listed]

    async def named(self, body: Any) -> ModelFacts:
        """The model a ``show`` body names, as listed (404 in Ollama's words if none is)."""
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest("model is required: name a model that GET api/tags lists.", param="model")
        facts = await self.model_facts()
        for candidate in ollama_api.name_candidates(name):
            for entry in facts:
                served = entry.info.model_names() if entry.info is not None else []
                if candidate in (entry.name, entry.path, Path(entry.path).name, *served):
                    return entry
        raise NotFound(f"model {show(name)} not found: GET api/tags lists the models here.", param="model")

    async def served(self, body: Any) -> tuple[EngineInfo, str]:
        """The model the body names brought (loaded on demand, its turn waited for), and the
        served name it stands for (``tiny:latest`` for ``tiny``)."""
        sent = ollama_api.model_name(body)
        for name in ollama_api.name_candidates(sent):
            info = await self.ready_for({"model": name})
            if name in info.model_names():
                return info, name
        return info, sent  # the parser's 404 names the models served

    def side_service(self, names: list[str]) -> Any | None:
        """The service of a model resident beside the loaded one (``InferApp.max_loaded_models``)
        that one of ``names`` stands for; ``None``: the service's own model serves them."""
        residents = getattr(self.service, "residents", None)
        for side in residents.services() if residents is not None else []:
            info = side.info
            if info is not None and any(name in info.model_names() for name in names):
                return side
        return None

    def info_of(self, path: str) -> EngineInfo | None:
        """What a model in memory says of itself (the loaded one, or one resident beside it)."""
        main = self.loaded_info()
        if main is not None and path in main.model_names():
            return main
        side = self.side_service([path])
        return side.info if side is not None and side.state == "ready" else None

    async def unload(self, model: str, *, after_answer: bool) -> bool:
        """``keep_alive: 0``: the model ``model`` names out of memory once no other request runs
        on it (the shelf's own, or one resident beside it); only where this server runs the model
        itself, and for a user who may (it is everyone's). After an answer, what may not be done
        is left undone."""
        shelf = self.shelf
        names = ollama_api.name_candidates(model)
        try:
            if shelf is None or not shelf.switchable:
                raise InvalidRequest("This server does not run its model itself (an upstream server, or a router's "
                                     "backends): there is no model here to unload.", param="keep_alive")
            if not self.viewer.sees_all:
                raise Forbidden("Unloading the model changes it for every user of this server: only an admin may "
                                "(InferApp.admin_users, or a JupyterHub admin).")
            side = self.side_service(names)
            main = self.service.info
            if side is None and main is not None and not any(n in main.model_names() for n in names):
                return False  # not in memory: nothing to unload
            await self._idle(side or self.service)
        except InferError:
            if after_answer:
                return False
            raise
        if side is not None:
            return await self.service.residents.unload(side.info.model)
        await shelf.unload("the model was unloaded (keep_alive: 0)")
        return True

    @staticmethod
    async def _idle(service: Any) -> None:
        """Wait until nothing is queued or running on ``service`` (409 past ``UNLOAD_WAIT_S``)."""
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while service.queue_depth or service.num_running:
            if time.monotonic() > deadline:
                raise ollama_api.ModelBusy("The model is still answering other requests: it was not unloaded. "
                                           "Try again once they are done.", param="keep_alive")
            await asyncio.sleep(0.05)


def _facts(entry: dict[str, Any], info: EngineInfo | None) -> ModelFacts:
    """A listing's entry, with its file's time and what its ``config.json`` says (cheap reads:
    a folder's own, or the Hugging Face cache's copy for a Hub id)."""
    path = str(entry.get("path") or entry["id"])
    facts = ModelFacts(str(entry["id"]), path, str(entry.get("source", "")), int(entry.get("size_bytes") or 0),
                       info=info)
    config_file: Any = Path(path) / "config.json" if os.path.isdir(path) else None
    if facts.source == "huggingface":
        # Imported here: the server starts without it; a listing of the cache has imported it already.
        from huggingface_hub import try_to_load_from_cache

        config_file = try_to_load_from_cache(path, "config.json")
    try:
        facts.modified = os.stat(config_file if isinstance(config_file, (str, Path)) else path).st_mtime
        config = json.loads(Path(config_file).read_text()) if isinstance(config_file, (str, Path)) else {}
    except (OSError, ValueError):
        return facts
    if not isinstance(config, dict):
        return facts
    facts.family = str(config.get("model_type") or "")
    context = config.get("max_position_embeddings") or config.get("n_positions")
    facts.context_length = context if isinstance(context, int) else None
    return facts


class AnswerHandler(OllamaHandler):
    """``api/chat`` and ``api/generate``: one answer, whole or as NDJSON lines."""

    generates = True
    chat = True

    def parse(self, body: Any, info: EngineInfo, model: str) -> ollama_api.OllamaCall:
        raise NotImplementedError

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        start = time.monotonic()
        body = self.read_json()
        ollama_api.model_name(body)
        alive = ollama_api.keep_alive(body.get("keep_alive"))
        if ollama_api.only_model(body, self.chat) and alive == 0:  # Ollama's "unload" idiom
            await self.unload(body["model"], after_answer=False)
            self.finish(ollama_answers.loaded(ollama_api.OllamaCall(None, body["model"], self.chat), "unload"))
            return
        info, model = await self.served(body)
        load_s = time.monotonic() - start
        call = self.parse(body, info, model)
        if call.request is None:  # Ollama's "load" idiom: the model is loaded now
            self.finish(ollama_answers.loaded(call, "load"))
            return
        self.say_ignored(call.ignored)
        stream = await self.submit(call.request)

        def took() -> tuple[float, float]:
            return time.monotonic() - start, load_s

        if call.stream:
            await self._stream(stream, call, took)
        else:
            result = await self.whole_result(stream)
            if result is None:
                return
            self.finish(ollama_answers.answer(call, result, *took()))
        if call.keep_alive_s == 0 and not self.gone.is_set():
            await self.unload(model, after_answer=True)

    async def _stream(self, stream: RequestStream, call: ollama_api.OllamaCall,
                      took: Callable[[], tuple[float, float]]) -> None:
        lines = ollama_answers.AnswerLines(call)

        def render(_: int, event: TokenEvent | RequestResult) -> str:
            if isinstance(event, TokenEvent):
                return ollama_answers.ndjson(lines.pieces(event.pieces))
            return ollama_answers.ndjson(lines.end(event, *took()))

        self.set_status(200)
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("X-Accel-Buffering", "no")  # nginx: pass each line through
        self.streaming = True
        if not await self.send(""):  # the headers now: the client knows the call was taken
            return
        outcome = await self.relay([stream], render)
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
        elif outcome is not None:
            self.finish_lines()


class ChatHandler(AnswerHandler):
    """``POST infer/api/chat``."""

    def parse(self, body: Any, info: EngineInfo, model: str) -> ollama_api.OllamaCall:
        return ollama_api.parse_chat_call(body, info, model, max_new_tokens=self.max_new_tokens)


class GenerateHandler(AnswerHandler):
    """``POST infer/api/generate``."""

    chat = False

    def parse(self, body: Any, info: EngineInfo, model: str) -> ollama_api.OllamaCall:
        return ollama_api.parse_generate_call(body, info, model, max_new_tokens=self.max_new_tokens)


class EmbedHandler(OllamaHandler):
    """``POST infer/api/embed`` and ``infer/api/embeddings``: each input an embedding request
    the engine runs beside the others (``wire/ollama_embed``)."""

    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        started = time.monotonic()
        body = self.read_json()
        _, model = await self.served(body)
        call = ollama_embed.parse_embed(body, model)
        self.say_ignored(call.ignored)
        without_gzip(self)
        results = await results_of(self, await self.submit_all(call.requests))
        if results is not None:
            self.finish(ollama_embed.answer(call, results, int((time.monotonic() - started) * 1e9)))


class TagsHandler(OllamaHandler):
    """``GET infer/api/tags``: every model this server can serve."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def get(self) -> None:
        self.finish({"models": [ollama_models.tag(f) for f in await self.model_facts()]})


class ShowHandler(OllamaHandler):
    """``POST infer/api/show``: one model's details, info and capabilities (the loaded
    model's in full; a model not loaded is not loaded to say more)."""

    @web.authenticated
    @authorized("read")  # reading, though it is a POST
    @answers_errors
    async def post(self) -> None:
        self.finish(ollama_models.show(await self.named(self.read_json())))


class PsHandler(OllamaHandler):
    """``GET infer/api/ps``: the model in memory (none after an unload)."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def get(self) -> None:
        facts = [f for f in await self.model_facts() if f.info is not None]
        after = self.service.config.unload_after_s if self.shelf is not None else 0.0
        self.finish({"models": [ollama_models.running(f, after) for f in facts]})


class VersionHandler(OllamaHandler):
    """``GET infer/api/version``: the Ollama API version these routes follow."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def get(self) -> None:
        self.finish(ollama_models.version())


class StoreHandler(OllamaHandler):
    """``pull``, ``push``, ``create``, ``copy``, ``delete`` and blobs: a 400 that says where
    models come from here."""

    _VERBS = {"pull": "download", "push": "publish", "create": "create", "copy": "copy", "delete": "delete"}

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def post(self, action: str) -> None:
        verb = self._VERBS.get(action, "store")
        raise InvalidRequest(NO_STORE.format(what=f"api/{action}", verb=verb))

    delete = head = post


class OllamaNotFoundHandler(OllamaHandler):
    """Any other path under ``infer/api/``: a 404 in Ollama's shape."""

    @web.authenticated
    def get(self, *args: Any) -> None:
        raise web.HTTPError(404, f"No route {self.request.path}: docs/ollama.md lists the Ollama routes served here.")

    post = put = patch = delete = get


ROUTES: list[tuple[str, type]] = [
    (r"/infer/api/chat", ChatHandler),
    (r"/infer/api/generate", GenerateHandler),
    (r"/infer/api/tags", TagsHandler),
    (r"/infer/api/show", ShowHandler),
    (r"/infer/api/ps", PsHandler),
    (r"/infer/api/version", VersionHandler),
    (r"/infer/api/(pull|push|create|copy|delete|blobs)(?:/.*)?", StoreHandler),
    (r"/infer/api/embed", EmbedHandler),
    (r"/infer/api/embeddings", EmbedHandler),  # the older route: one 'prompt', one 'embedding'
    # Keep last: Ollama routes added later go above it.
    (r"/infer/api/.*", OllamaNotFoundHandler),
]
