"""Several models resident at once (``InferApp.max_loaded_models``; Ollama's
``OLLAMA_MAX_LOADED_MODELS``, llama-server's router): a chat model, an embedder and a coder
side by side, each in a service of its own (its own engine, scheduler, queue and fair share),
beside the service's own model.

A request naming a listed model that is not loaded loads it beside the others while fewer than
``max_loaded_models`` are resident; past that, or where its weights would not fit in the memory
the machine has available, the least recently used side model goes first (its requests finish,
up to ``switch_drain_s``). A model that would not fit even alone is refused with the bytes it
needs and the bytes there are. With ``max_loaded_models = 1`` (the default) there is no side
model: the shelf switches the one model (``model_shelf.py``)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..cpu.process_memory import release_freed
from ..errors import EngineUnavailable
from ..values.sizes import readable_bytes

if TYPE_CHECKING:
    from ..formats.model_catalog import LocalModel
    from ..values.config import ServiceConfig

log = logging.getLogger(__name__)
# What a model takes in memory beyond its files (activations, KV, the runtime), as a share.
LOAD_OVERHEAD = 1.2


@dataclass
class Resident:
    """A side model: its listing, its service, when a request last named it."""

    listed: LocalModel
    service: Any  # an InferenceService of its own
    last_used: float

    def names(self) -> set[str]:
        info = self.service.info
        return {self.listed.id, self.listed.path, *(info.model_names() if info is not None else ())}

    def to_json(self) -> dict[str, Any]:
        info = self.service.info
        details = info.details if info is not None else {}
        held = details.get("weight_bytes") or self.listed.size_bytes
        return {"id": self.listed.id, "path": self.listed.path, "state": self.service.state,
                "engine": info.engine if info is not None else None, "bytes": held,
                "idle_s": round(time.monotonic() - self.last_used, 1),
                "queue_depth": self.service.queue_depth, "running": self.service.num_running}


def available_bytes() -> int | None:
    """The memory the machine can still give (``MemAvailable``); ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Residents:
    """The side models of one service, by path. ``make`` builds a service for a config."""

    def __init__(self, config: Callable[[], ServiceConfig], make: Callable[[ServiceConfig], Any]) -> None:
        self._config = config
        self._make = make
        self._side: dict[str, Resident] = {}
        self._lock = asyncio.Lock()  # one load or eviction at a time

    @property
    def capacity(self) -> int:
        """How many side models may be resident besides the service's own."""
        return max(0, self._config().max_loaded_models - 1)

    def services(self) -> list[Any]:
        return [r.service for r in self._side.values()]

    def serving(self, model: str | None) -> Any | None:
        """The side service that serves ``model`` (a name it is listed or served by);
        ``None``: the service's own model, or none named."""
        if model is None or not self._side:
            return None
        for resident in self._side.values():
            if model in resident.names():
                resident.last_used = time.monotonic()
                return resident.service
        return None

    async def bring(self, listed: LocalModel) -> Any:
        """The side service for ``listed``, loaded beside the others (room made first), ready."""
        async with self._lock:
            resident = self._side.get(listed.path)
            if resident is None:
                await self._make_room(listed)
                cfg = self._config()
                engine = "simulated" if listed.path == "simulated" else "hf"
                service = self._make(replace(cfg, model=listed.path, engine=engine, max_loaded_models=1,
                                             load_on_demand=False))
                service.start()
                resident = self._side[listed.path] = Resident(listed, service, time.monotonic())
                log.info("jupyter_infer | loading %s beside the loaded model (%d of InferApp.max_loaded_models=%d)",
                         listed.id, len(self._side) + 1, cfg.max_loaded_models)
            resident.last_used = time.monotonic()
        try:
            await resident.service.wait_ready()
        except EngineUnavailable:
            await self._drop(resident, "it failed to load", drain=False)
            raise
        return resident.service

    async def _make_room(self, listed: LocalModel) -> None:
        """Evict the least recently used side models until one more fits, in count and in memory."""
        need = int(listed.size_bytes * LOAD_OVERHEAD)
        while self._side and (len(self._side) >= self.capacity or not self._fits(need)):
            oldest = min(self._side.values(), key=lambda r: r.last_used)
            await self._drop(oldest, f"{listed.id} needed its place (InferApp.max_loaded_models)", drain=True)
        if not self._fits(need):
            free = available_bytes() or 0
            raise EngineUnavailable(
                f"{listed.id} needs about {readable_bytes(need)} of memory and {readable_bytes(free)} is available, "
                "with no other side model left to unload: unload the loaded model (DELETE infer/models), serve it "
                "quantized (InferApp.quantize = 'int8' or 'int4'), or free memory.")

    @staticmethod
    def _fits(need: int) -> bool:
        free = available_bytes()
        return free is None or need <= free

    async def _drop(self, resident: Resident, reason: str, *, drain: bool) -> None:
        """Stop a side model (its requests finish first, up to ``switch_drain_s``, with ``drain``)."""
        self._side.pop(resident.listed.path, None)
        service = resident.service
        deadline = time.monotonic() + self._config().switch_drain_s
        while drain and (service.queue_depth or service.num_running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        log.info("jupyter_infer | unloading %s: %s", resident.listed.id, reason)
        await service.close(f"the model was unloaded: {reason}")
        await asyncio.to_thread(_free)

    async def unload(self, model: str) -> bool:
        """Unload the side model ``model`` names; False if none does."""
        resident = next((r for r in self._side.values() if model in r.names()), None)
        if resident is None:
            return False
        async with self._lock:
            await self._drop(resident, "it was unloaded", drain=False)
        return True

    async def stop(self) -> None:
        for resident in list(self._side.values()):
            await self._drop(resident, "the server is shutting down", drain=False)

    def listing(self) -> list[dict[str, Any]]:
        """The side models, the most recently used first."""
        return [r.to_json() for r in sorted(self._side.values(), key=lambda r: -r.last_used)]


def _free() -> None:
    """Give a dropped model's memory back to the machine."""
    gc.collect()
    release_freed()
