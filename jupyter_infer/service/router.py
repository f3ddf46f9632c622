"""``RouterService``: several named backends behind ``InferenceService``'s public API.

Each backend is an ``InferenceService`` of its own (a local engine, the simulated one, or an
upstream server), with its own queue and limits. The router picks one per request (``Rule``),
hands out one ``RequestStream`` whatever happens behind it, and moves a request to its
fallback backend when the first one fails before its first token. Handlers, the embedded
client and the panels talk to it as to any service; what differs is visible in the answers:
a ``route`` on each result, record and event, and per-route metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..errors import EngineUnavailable, InferError, InvalidRequest, QueueFull
from ..values.engine_info import EngineInfo
from ..values.events import EventBus, Subscription
from ..values.limits import Limits
from ..values.metrics import MetricsCollector, wall
from ..values.stream import RequestStream
from .inference import InferenceService
from .routing import Decision, Rule

if TYPE_CHECKING:
    from ..engine import Engine
    from ..upstream.connection import UpstreamServer
    from ..values.config import ServiceConfig
    from ..values.request import Request

log = logging.getLogger(__name__)


class RouterService:
    """``engine = "router"``. ``loaders`` / ``upstreams`` replace a backend's engine loader or
    upstream server by name (tests)."""

    def __init__(
        self, config: ServiceConfig, *, loaders: Mapping[str, Callable[[], Engine]] | None = None,
        upstreams: Mapping[str, UpstreamServer] | None = None,
    ) -> None:
        configs = config.backend_configs()
        self.config = config
        self.collector = MetricsCollector(keep=config.keep_records)  # the totals over all backends
        self.events = EventBus(capacity=config.event_buffer, max_subscribers=config.max_event_subscribers)
        batch_ids = itertools.count(1)  # one id space, so the backends' batch records merge
        self.backends = {
            name: InferenceService(
                cfg, engine_loader=(loaders or {}).get(name), route=name, parent=self.collector,
                events=self.events, batch_ids=batch_ids, upstream=(upstreams or {}).get(name),
            )
            for name, cfg in configs.items()
        }
        self.rule = Rule(config, configs)
        limits = [b.limits for b in self.backends.values()]
        self.limits = Limits(mode=config.mode, **{
            f.name: max(getattr(x, f.name) for x in limits) for f in fields(Limits) if f.name != "mode"
        })
        self.fallbacks: Counter[str] = Counter()  # "from->to": requests moved
        self._live: dict[str, str] = {}  # request id -> the backend serving it now
        self._moving: set[str] = set()  # on the way to their fallback: no backend holds them
        self._cancelled: set[str] = set()  # cancelled on the way: the fallback's stream is, at once
        self._relays: set[asyncio.Task] = set()
        self._stopping = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        for backend in self.backends.values():
            backend.start()

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        self._stopping = True  # no fallback to a backend that is about to stop too
        for backend in self.backends.values():
            await backend.stop(reason)
        if self._relays:
            await asyncio.gather(*self._relays, return_exceptions=True)

    @property
    def started(self) -> bool:
        return any(b.started for b in self.backends.values())

    @property
    def state(self) -> str:
        """``ready`` while any backend is; else ``loading``, ``unreachable``, ``stopped`` or
        ``failed``."""
        states = {b.state for b in self.backends.values()}
        for state in ("ready", "loading", "unreachable", "stopped"):
            if state in states:
                return state
        return "failed"

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        """Wait until every backend has loaded (or failed); the router's info lists the
        models of those that are ready. Raises ``EngineUnavailable`` if none is."""
        names = list(self.backends)
        outcomes = await asyncio.gather(
            *(self.backends[n].wait_ready(timeout) for n in names), return_exceptions=True
        )
        infos = {n: r for n, r in zip(names, outcomes, strict=True) if isinstance(r, EngineInfo)}
        if not infos:
            why = "; ".join(f"{n}: {getattr(r, 'message', None) or type(r).__name__}"
                            for n, r in zip(names, outcomes, strict=True))
            raise EngineUnavailable(f"No backend of the router is available ({why}).")
        first = infos.get(self.rule.default) or next(iter(infos.values()))
        return EngineInfo(
            engine="router", model=first.model, device="router", dtype="n/a",
            max_context=max(i.max_context for i in infos.values()),
            details={"routes": {n: i.engine for n, i in infos.items()}},
            models=[{"id": i.model, "route": n} for n, i in infos.items()],
        )

    # -- requests ---------------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Pick the backend and queue ``request`` there (or at its fallback, if that backend
        refuses it with 429 or 5xx); raise what the service would, queueing nothing."""
        try:
            decision = self.rule.pick(request, self._served())
        except InvalidRequest:
            self.collector.rejected("invalid")
            raise
        route = decision.backend
        try:
            inner = await self._attempt(route, request)
        except InferError as err:
            if not self._may_fall_back(err, decision, route):
                raise
            route = self._fell_back(request, decision, err)
            inner = await self._attempt(route, request)
        outer = RequestStream(request.id, self.cancel)
        outer.follow(inner, route)
        self._live[request.id] = route
        task = asyncio.get_running_loop().create_task(
            self._relay(outer, inner, request, decision, route), name=f"jupyter-infer-route-{request.id}"
        )
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        return outer

    async def _attempt(self, route: str, request: Request) -> RequestStream:
        # The same value for a fallback: a backend prepares its own resolved copy.
        return await self.backends[route].submit(request)

    def _may_fall_back(self, err: InferError, decision: Decision, route: str) -> bool:
        return (
            decision.fallback is not None and route == decision.backend and not self._stopping
            and (err.status >= 500 or isinstance(err, QueueFull))
        )

    def _fell_back(self, request: Request, decision: Decision, err: InferError) -> str:
        target = decision.fallback
        self.fallbacks[f"{decision.backend}->{target}"] += 1
        log.info("jupyter_infer: request %s: %s failed before its first token (%s); trying %s",
                 request.id, decision.backend, err.message, target)
        if self.events.has_subscribers:
            self.events.publish({"type": "fallback", "id": request.id, "from": decision.backend,
                                 "to": target, "error": err.message, "at": wall(time.monotonic())})
        return target

    async def _relay(
        self, outer: RequestStream, inner: RequestStream, request: Request, decision: Decision, route: str,
    ) -> None:
        """Pass ``inner``'s tokens and result on; before the first token, a failure moves the
        request to the fallback backend once."""
        try:
            while True:
                got_text = False
                try:
                    async for event in inner:
                        got_text = got_text or bool(event.text)
                        outer.push(event)
                    result = await inner.result()
                except InferError as err:
                    if got_text or not self._may_fall_back(err, decision, route):
                        outer.finish(error=err)
                        return
                    route = self._fell_back(request, decision, err)
                    self._moving.add(request.id)
                    try:
                        inner = await self._attempt(route, request)
                    except InferError as again:
                        outer.finish(error=again)
                        return
                    finally:
                        self._moving.discard(request.id)
                    outer.follow(inner, route)
                    self._live[request.id] = route
                    if request.id in self._cancelled:  # cancelled on the way
                        inner.cancel()
                    continue
                outer.finish(result)
                return
        finally:
            self._live.pop(request.id, None)
            self._cancelled.discard(request.id)
            if not outer.done:  # cancelled (the router stopped): end it, never leave it hanging
                outer.finish(error=EngineUnavailable("The router stopped while serving this request."))

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request on whichever backend holds it, or, when it is on
        its way to its fallback, as soon as the fallback has it."""
        route = self._live.get(request_id)
        if route is None:
            return False
        if self.backends[route].cancel(request_id):
            return True
        if request_id in self._moving:
            self._cancelled.add(request_id)
            return True
        return False

    def owner_of(self, request_id: str) -> str | None:
        route = self._live.get(request_id)
        if route is not None:
            return self.backends[route].owner_of(request_id)
        return next((o for b in self.backends.values() if (o := b.owner_of(request_id)) is not None), None)

    def reject(self, reason: str, *, outcome: str = "rejected") -> None:
        self.collector.rejected(reason, outcome)

    def knows(self, request_id: str) -> bool:
        return request_id in self._live or any(b.knows(request_id) for b in self.backends.values())

    # -- the tokenizer: the first local backend's (an upstream has none here) ---------------
    def _tokenizing(self) -> InferenceService:
        return next((b for b in self.backends.values() if b.has_tokenizer), next(iter(self.backends.values())))

    async def tokenize(self, text: str) -> list[int]:
        return await self._tokenizing().tokenize(text)

    async def render_chat(self, request: Request) -> str:
        return await self._tokenizing().render_chat(request)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self._tokenizing().detokenize(token_ids)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        return self._tokenizing().token_texts(token_ids)

    def _served(self) -> dict[str, list[str]]:
        """What each backend answers to as a ``model``: its name, then its model's names."""
        served = {}
        for name, backend in self.backends.items():
            info = backend.info
            models = info.model_names() if info else [backend.config.upstream_model or backend.config.model]
            served[name] = list(dict.fromkeys([name, *(m for m in models if m and m != "default")]))
        return served

    # -- views ------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return sum(b.queue_depth for b in self.backends.values())

    @property
    def num_running(self) -> int:
        return sum(b.num_running for b in self.backends.values())

    def subscribe(self) -> Subscription:
        return self.events.subscribe()

    def prefix_cache(self) -> dict[str, Any] | None:
        """None: each backend has its own (``metrics()['routes']``)."""
        return None

    def kv_cache(self) -> dict[str, Any] | None:
        """The KV memory every backend's rows hold, summed (``None``: none keeps KV here)."""
        parts = [u for b in self.backends.values() if (u := b.kv_cache()) is not None]
        if not parts:
            return None
        held = sum(p["bytes_held"] for p in parts)
        needed = sum(p["tokens_held"] * p["bytes_per_token"] for p in parts)
        per_token = {p["bytes_per_token"] for p in parts}
        return {"bytes_held": held, "tokens_held": sum(p["tokens_held"] for p in parts),
                "bytes_per_token": per_token.pop() if len(per_token) == 1 else None,  # models differ
                "waste_ratio": round(held / needed, 3) if needed else None,
                "shared_tokens": sum(p.get("shared_tokens", 0) for p in parts),
                "state_bytes": sum(p.get("state_bytes", 0) for p in parts)}

    def status(self) -> dict[str, Any]:
        routes = {name: b.status() for name, b in self.backends.items()}
        # The default backend's engine, model and device at the top, for views that show one.
        default = {k: v for k, v in routes[self.rule.default].items() if k not in ("route", "upstream")}
        failed = [f"{n}: {s['load_error']}" for n, s in routes.items() if s["load_error"]]
        return {
            **default,
            "state": self.state,
            "load_error": "; ".join(failed) or None,
            "engine": "router",
            "limits": {f.name: getattr(self.limits, f.name) for f in fields(Limits) if f.name != "mode"},
            "queue_depth": self.queue_depth,
            "running": self.num_running,
            "configured": {"engine": "router",
                           "backends": {n: b.config.engine for n, b in self.backends.items()}},
            "routes": routes,
            "rule": self.rule.describe(),
            "fallbacks": dict(self.fallbacks),
            "timeline": ("records carry their route; a record with source 'upstream' is a set of "
                         "requests in flight upstream together, not an engine batch"),
        }

    def metrics(self) -> dict[str, Any]:
        """The totals over every backend, and each backend's own under ``routes``."""
        out = self.collector.snapshot(queue_depth=self.queue_depth, running=self.num_running)
        out["routes"] = {name: b.metrics() for name, b in self.backends.items()}
        out["fallbacks"] = dict(self.fallbacks)
        out["events"] = self.events.stats()
        return out

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """Every backend's batch and request records, merged in time order; each names its
        ``route`` (and ``source``: engine batches or upstream spans)."""
        parts = [b.batches(limit, requests) for b in self.backends.values()]
        batches = sorted((x for p in parts for x in p["batches"]), key=lambda b: b["started_at"])
        records = sorted((r for p in parts for r in p["requests"]), key=lambda r: r["queued_at"])
        return {
            "batches": batches[-limit:],
            "requests": records[-(requests or 4 * limit):],
            "running": [i for p in parts for i in p["running"]],
            "waiting": [i for p in parts for i in p["waiting"]],
            "parked": [i for p in parts for i in p.get("parked", [])],
            "mode": self.config.mode,
            "routes": list(self.backends),
            "now": wall(time.monotonic()),
        }
