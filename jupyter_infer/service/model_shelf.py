"""The models a service can serve, which one is loaded, and switching them at run time.

Ollama loads the model a request names and unloads it when idle; LM Studio has a picker.
Here: ``listing`` (``formats/model_catalog``: the Hugging Face cache, ``InferApp.model_dirs``,
Ollama's store), ``load`` (in place of the loaded one: the requests queued or running on it
finish first, up to ``switch_drain_s``, then are cancelled; new ones wait for the new model),
``unload`` (memory back to the machine; the next request loads it again), loading on demand
(``load_on_demand``: a request naming another listed model) and unloading after
``unload_after_s`` idle seconds. Jupyter and its kernels are untouched throughout.

On demand, requests for a model that is not loaded wait their model's turn (``bring``), never
a 503: the loaded model's requests go first, then one switch to the model waited for longest,
whose waiting requests all go, at most ``switches_per_minute`` switches in any minute (past
that, the loaded model serves its own newcomers until a switch may happen again, so two agents on
two models cannot make every request a switch). A request holds its model from its turn until it is
queued (``turn``), so no switch drops it in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..cpu.process_memory import release_freed
from ..errors import EngineUnavailable, InvalidRequest, UnknownModel
from ..formats.model_catalog import LocalModel, find, local_models
from ..formats.model_source import locate
from ..values.config import LOCAL_ENGINES, MANAGED_ENGINES

if TYPE_CHECKING:
    from ..loops.request_loop import RequestLoop
    from ..values.config import ServiceConfig
    from ..values.engine_info import EngineInfo

log = logging.getLogger(__name__)
CATALOG_TTL_S = 10.0  # how long a read of the machine's models serves the requests that ask it
SWITCHABLE_OPTIONS = ("quantize", "dtype", "device", "num_threads")  # what a load may change besides the model


class Shelved(Protocol):
    """What the shelf asks of its service (``InferenceService``)."""

    config: ServiceConfig
    route: str | None

    @property
    def info(self) -> EngineInfo | None: ...
    @property
    def state(self) -> str: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    def replace_loop(self, config: ServiceConfig) -> RequestLoop: ...
    def start(self) -> None: ...
    async def wait_ready(self, timeout: float | None = None) -> EngineInfo: ...
    async def wait_loaded(self) -> EngineInfo: ...


class ModelShelf:
    def __init__(self, service: Shelved) -> None:
        self._service = service
        self._lock = asyncio.Lock()  # one switch at a time
        self.unloaded = False  # no model in memory: the next request (or a load) brings one
        self._idle_task: asyncio.Task | None = None
        self._last_active = time.monotonic()
        self._listed: tuple[float, list[LocalModel]] | None = None  # when the catalog was read, and it
        self._stopped = False  # the service stopped: no switch starts a loop any more
        # Load on demand: the requests waiting for a model that is not loaded, by its path, in
        # the order they came; those between their turn and their queue; who switches next.
        self._waiting: dict[str, list[tuple[float, asyncio.Future[None]]]] = {}
        self._holding = 0
        self._turns: asyncio.Task | None = None
        # When requests' turns switched the model, over the last minute (switches_per_minute).
        self._switched: deque[float] = deque()
        self.switches = 0  # how many times a request's model was switched to (infer/models says)

    @property
    def switchable(self) -> bool:
        """A local engine of its own, or a serving engine it runs as a child (not an upstream
        someone else runs, not one backend of a router)."""
        engine = self._service.config.engine
        return (engine in LOCAL_ENGINES or engine in MANAGED_ENGINES) and self._service.route is None

    @property
    def _managed(self) -> bool:
        return self._service.config.engine in MANAGED_ENGINES

    # -- what there is ----------------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """Every model this machine can serve, the loaded one first, each saying if it is (and
        if it is the one configured: what the server loads again after an unload)."""
        service, cfg = self._service, self._service.config
        if not self.switchable:
            return []
        listed = [m.to_json() for m in self._catalog_now() if _loads(cfg.engine, m.source)]
        ready = service.info is not None and service.state == "ready"
        # A child names its model its own way (llama-server: the file it was given): by the path it was started with.
        loaded = (cfg.model if self._managed else service.info.model) if ready else None
        configured = "simulated" if cfg.engine == "simulated" else cfg.model
        ours = () if self._managed else (("simulated", "simulated engine"),)
        for path, source in (*ours, (configured, "configured"), (loaded, "loaded")):
            if path and not any(m["path"] == path for m in listed):  # wherever it is (a Hub id, a stand-in)
                listed.insert(0, {"id": path, "path": path, "source": source, "size_bytes": None})
        beside = {r["path"] for r in service.residents.listing()}
        for entry in listed:
            entry["loaded"] = entry["path"] == loaded or entry["path"] in beside
            entry["configured"] = entry["path"] == configured
        return sorted(listed, key=lambda e: (not e["loaded"], not e["configured"]))

    async def _catalog(self) -> list[LocalModel]:
        """The machine's models, read on a worker thread (a large Hugging Face cache takes a
        while to scan), at most every ``CATALOG_TTL_S``: a request naming a model not served
        here asks it."""
        if self._listed is None or time.monotonic() - self._listed[0] > CATALOG_TTL_S:
            self._listed = (time.monotonic(), await asyncio.to_thread(local_models, self._service.config.model_dirs))
        return self._listed[1]

    def _catalog_now(self) -> list[LocalModel]:
        """The same, read now (infer/models asks for the list as it is)."""
        self._listed = (time.monotonic(), local_models(self._service.config.model_dirs))
        return self._listed[1]

    def answer(self) -> dict[str, Any]:
        """``infer/models``'s answer: the state, the model loaded, every model listed."""
        service = self._service
        return {"state": service.state, "model": service.info.model if service.info else None,
                "models": self.listing(), "load_on_demand": service.config.load_on_demand,
                "unload_after_s": service.config.unload_after_s, "switches": self.switches,
                "max_loaded_models": service.config.max_loaded_models, "resident": service.residents.listing(),
                "waiting": {path: len(waiters) for path, waiters in self._waiting.items() if waiters}}

    # -- switching --------------------------------------------------------------------------
    async def load(self, name: str, **options: Any) -> EngineInfo:
        """Serve ``name`` (a listed id, a checkpoint folder, a .gguf file, a Hub id, or
        ``simulated``) in place of the loaded model; returns what was loaded, or raises
        ``EngineUnavailable`` saying why it could not load (the server then says so too)."""
        if not self.switchable:
            raise InvalidRequest("This server does not run its model itself (an upstream server, or a router's "
                                 "backends): switch models there, or in InferApp.router_backends.")
        unknown = sorted(set(options) - set(SWITCHABLE_OPTIONS))
        if unknown:
            raise InvalidRequest(f"A load may set {', '.join(SWITCHABLE_OPTIONS)} besides the model; "
                                 f"not {', '.join(unknown)}.")
        cfg = self._service.config
        listed = find(name, await self._catalog())
        path = listed.path if listed else name.strip()
        engine = cfg.engine if self._managed else "simulated" if path == "simulated" else "hf"
        try:
            config = replace(cfg, model=path, engine=engine, **{k: v for k, v in options.items() if v is not None})
            if engine == "llama.cpp":
                _gguf_file(path)
            elif engine not in ("simulated", "command"):
                locate(path)  # a mistake (no such path, not a model) is refused before anything is dropped
        except (TypeError, ValueError) as err:
            raise InvalidRequest(str(err), param="model") from None
        before = cfg if self._service.state == "ready" else None
        await self._switch(config, f"the model was switched to {name}")
        try:
            info = await self._service.wait_ready()
        except EngineUnavailable as err:
            if before is None:
                raise
            await self._switch(before, "a load failed")  # the model that served before serves again
            with contextlib.suppress(EngineUnavailable):
                await self._service.wait_ready()
            raise EngineUnavailable(f"{err.message} The previous model ({before.model}) is loaded again.") from None
        if listed is not None and listed.id not in info.model_names():
            info.aliases.append(listed.id)  # a request may name it as it was listed
        return info

    async def unload(self, reason: str = "the model was unloaded") -> None:
        """No model in memory; requests queued or running now end with ``reason``. The next
        request (or a load) brings the model back."""
        if not self.switchable:
            raise InvalidRequest("This server does not run its model itself (an upstream server, or a router's "
                                 "backends): there is no model here to unload.")
        async with self._lock:
            if self.unloaded:
                return
            old = self._service.replace_loop(self._service.config)
            self.unloaded = True
            await asyncio.shield(self._retire(old, reason, drain=False))

    async def bring(self, model: str | None) -> None:
        """Before a request: the model back if it was unloaded; with ``load_on_demand``, the
        listed model ``model`` names, its turn waited for (see the module's docstring)."""
        self._last_active = time.monotonic()
        path = await self._wanted(model)
        # After an unload, a request for another model loads that one (below), not the old one first.
        if self.unloaded and (path is None or path == self._service.config.model):
            async with self._lock:
                if self.unloaded:
                    self.unloaded = False
                    self._service.start()  # its own config: what was loaded before
        if path is None or (path == self._service.config.model and not self._yields()):
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (time.monotonic(), waiter)
        self._waiting.setdefault(path, []).append(entry)
        if self._turns is None or self._turns.done():
            self._turns = asyncio.get_running_loop().create_task(self._take_turns(), name="jupyter-infer-model-turns")
        try:
            await waiter
        finally:
            # The caller gave up (its wait, cancelled, is done too): it waits no more, and no
            # switch happens for it.
            if entry in self._waiting.get(path, ()):
                self._waiting[path].remove(entry)

    async def resident(self, model: str | None) -> Any | None:
        """The service of a model resident beside the loaded one that ``model`` names, loaded
        beside it first where ``max_loaded_models`` allows (``service/residents.py``); ``None``:
        the loaded model serves it (or one switch will: ``bring``)."""
        residents = self._service.residents
        if model is None or not residents.capacity or not self.switchable:
            return None
        side = residents.serving(model)
        if side is not None:
            return side
        path = await self._wanted(model)
        if path is None or path == self._service.config.model:
            return None
        self._last_active = time.monotonic()
        listed = find(path, await self._catalog())
        return await residents.bring(listed) if listed is not None else None

    @contextlib.asynccontextmanager
    async def turn(self, model: str | None) -> AsyncIterator[None]:
        """``bring(model)``, then the model held for the caller until it has queued its request:
        no switch starts in between (the switch waits for the loaded model's queue to drain)."""
        await self.bring(model)
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    async def _wanted(self, model: str | None) -> str | None:
        """The path of the listed model ``model`` names where it is not the one loaded (``None``:
        the loaded one, any, or not a listed model: the request's own check says so)."""
        cfg = self._service.config
        if model is None or not self.switchable:
            return None
        info = self._service.info
        if info is not None and model in info.model_names():
            return None
        listed = find(model, await self._catalog())
        if listed is None:
            return None
        if listed.path != cfg.model and not cfg.load_on_demand:
            raise UnknownModel(f"The model {model!r} is on this machine but not loaded: load it (POST infer/models, "
                               "%infer_model, the panel), or let requests load it (InferApp.load_on_demand).",
                               param="model")
        return listed.path

    def _yields(self) -> bool:
        """Whether the loaded model's newcomers wait behind another model's turn: someone waits
        for another model, and a switch may happen now."""
        others = any(path != self._service.config.model and waiters for path, waiters in self._waiting.items())
        return others and self._may_switch()

    def _may_switch(self) -> bool:
        """Fewer than ``switches_per_minute`` switches in the last minute (or nothing loaded)."""
        now = time.monotonic()
        while self._switched and now - self._switched[0] >= 60.0:
            self._switched.popleft()
        return self.unloaded or len(self._switched) < self._service.config.switches_per_minute

    def _busy(self) -> bool:
        service = self._service
        return bool(self._holding or service.queue_depth or service.num_running)

    async def _take_turns(self) -> None:
        """While requests wait for a model: once the loaded model's requests are done (and it has
        had its time), switch to the model waited for longest, and let its requests go."""
        while any(self._waiting.values()):
            current = self._service.config.model
            others = [p for p, w in self._waiting.items() if w and p != current]
            fresh = not self._may_switch()
            if not others or fresh:  # the loaded model's own: none to yield to, or no switch may happen yet
                _release(self._waiting.pop(current, []))
            if not others:
                return
            if fresh or self._busy():
                await asyncio.sleep(0.05)
                continue
            path = min(others, key=lambda p: self._waiting[p][0][0])  # the one waited for longest
            waiters = self._waiting.pop(path)
            try:
                await self.load(path)
                self.switches += 1
            except Exception as err:  # its requests get why (the 503 of a model that failed); the others wait on
                _release(waiters, err)
                continue
            finally:
                self._switched.append(time.monotonic())
            _release(waiters)

    async def _switch(self, config: Any, reason: str) -> None:
        async with self._lock:
            old = self._service.replace_loop(config)
            self.unloaded = False
            # Shielded: a caller that gives up (a cancelled request, ^C on %infer_model) does
            # not leave the service between two models, waiting forever.
            await asyncio.shield(self._finish_switch(old, reason))

    async def _finish_switch(self, old: RequestLoop, reason: str) -> None:
        try:
            await self._retire(old, reason, drain=True)
        finally:
            if not self._stopped:
                self._service.start()

    async def _retire(self, old: RequestLoop, reason: str, *, drain: bool) -> None:
        """Let ``old``'s requests finish (up to ``switch_drain_s``), stop it, free its memory."""
        deadline = time.monotonic() + self._service.config.switch_drain_s
        while drain and old.counts() != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await old.stop(reason)
        old.release()
        if await asyncio.to_thread(_collect):
            asyncio.get_running_loop().create_task(self._freeze_when_ready())

    async def _freeze_when_ready(self) -> None:
        with contextlib.suppress(Exception):
            await self._service.wait_loaded()
            gc.freeze()

    # -- idle -------------------------------------------------------------------------------
    def start(self) -> None:
        after = self._service.config.unload_after_s
        if after > 0 and self._idle_task is None and self.switchable:
            self._idle_task = asyncio.get_running_loop().create_task(self._unload_when_idle(after))

    def stop(self) -> None:
        self._stopped = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None

    async def _unload_when_idle(self, after: float) -> None:
        while True:
            await asyncio.sleep(min(30.0, max(0.05, after / 4)))
            service = self._service
            if service.queue_depth or service.num_running:
                self._last_active = time.monotonic()
            elif not self.unloaded and service.state == "ready" and time.monotonic() - self._last_active >= after:
                model = service.info.model if service.info is not None else "the model"
                log.info("jupyter_infer | unloading %s after %g idle seconds (InferApp.unload_after_s); the next "
                         "request loads it again", model, after)
                await self.unload(f"the model was unloaded after {after:g} idle seconds")


def _loads(engine: str, source: str) -> bool:
    """Whether ``engine`` can load a model listed from ``source``: llama.cpp GGUF files (and
    Ollama's, which are GGUF), vLLM and SGLang checkpoints; ours and a command, any."""
    if engine == "llama.cpp":
        return source in ("gguf", "ollama")
    if engine in ("vllm", "sglang"):
        return source in ("folder", "huggingface")
    return True


def _gguf_file(path: str) -> None:
    """llama.cpp loads a GGUF file: anything else is refused before the running child stops."""
    where = Path(path).expanduser()
    if not where.is_file() or locate(str(where)).kind != "gguf":
        raise ValueError(f"llama.cpp serves a .gguf file, and {path} is "
                         f"{'a folder' if where.is_dir() else 'not one'}: name a GGUF file (infer/models lists them).")


def _release(waiters: list[tuple[float, asyncio.Future[None]]], error: BaseException | None = None) -> None:
    """Let waiting requests go (or fail with ``error``)."""
    for _, waiter in waiters:
        if waiter.done():
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)


def _collect() -> bool:
    """Free what the old model held; True if the heap was frozen. The server freezes its heap
    once a model is ready (server/startup_heap): frozen objects are never collected, so it is
    thawed first, and frozen again once the new model is ready (``_freeze_when_ready``)."""
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    release_freed()
    return frozen
