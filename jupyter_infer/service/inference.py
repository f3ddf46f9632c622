"""``InferenceService``: one engine (local, simulated, or an upstream server) behind the front's
queue; a ``Service`` (``protocol.py``) as the handlers, the embedded client, the bench, the
demo and loadgen know it.

It holds the limits, the metrics and the events, and a loop: an ``EngineLoop`` for a local
engine, an ``UpstreamLoop`` for ``engine = "openai"``. Both are ``RequestLoop``s: they
``prepare`` a request (tokenize or estimate, check), run it, and give a ``snapshot`` of their
state, so nothing here depends on which kind it is. ``engine = "router"`` is a
``RouterService`` over several of these (``services.make_service`` picks).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from ..engine import Engine
from ..errors import EngineUnavailable, InferError, refusal_reason
from ..loops.loop_factory import make_loop
from ..loops.tokenizing import off_loop, render_prompt
from ..upstream.managed_server import ManagedServer
from ..values.config import MANAGED_ENGINES, ServiceConfig
from ..values.engine_info import EngineInfo
from ..values.events import EventBus, Subscription
from ..values.limits import check_token_ids
from ..values.metrics import MetricsCollector, RequestRecord, wall
from ..values.request import Request, check_text
from ..values.stream import RequestStream
from .model_shelf import ModelShelf
from .owners import OwnerBudget
from .residents import Residents

if TYPE_CHECKING:
    from ..loops.request_loop import RequestLoop
    from ..upstream.connection import UpstreamServer


OPEN_RESERVE = 1024  # tokens an answer with no max_tokens reserves of its owner's budget


class InferenceService:
    """One engine (local or upstream) behind the front's queue.

    Behind a router, ``route`` names the backend on its records and events (and a request's
    model is not checked again: the router's rule matched it), ``parent`` is the router's
    collector (which sums every backend), ``events`` the router's bus and ``batch_ids`` the
    counter the backends share, so their batch records merge. ``upstream``
    replaces the upstream server of ``engine = "openai"`` (tests).
    """

    def __init__(
        self, config: ServiceConfig | None = None, *, engine_loader: Callable[[], Engine] | None = None,
        route: str | None = None, parent: MetricsCollector | None = None, events: EventBus | None = None,
        batch_ids: Iterator[int] | None = None, upstream: UpstreamServer | None = None,
        configured: dict[str, Any] | None = None,
    ) -> None:
        self.config = config or ServiceConfig()
        cfg = self.config
        if cfg.engine == "router":
            raise ValueError("InferenceService runs one engine; make_service(config) builds a router.")
        self.route = route
        self.collector = MetricsCollector(keep=cfg.keep_records, parent=parent)
        self.events = events or EventBus(capacity=cfg.event_buffer, max_subscribers=cfg.max_event_subscribers)
        # What the user set (a configuration refused as invalid shows what was given, not defaults).
        self._configured = configured
        self._batch_ids = batch_ids or itertools.count(1)  # one numbering across model switches
        self._child_start: asyncio.Task | None = None
        self._loop = self._new_loop(cfg, engine_loader=engine_loader, upstream=upstream)
        self._engine_loader = engine_loader
        self.limits = self._loop.limits
        self.models = ModelShelf(self)  # the models this machine can serve, and switching them
        # Models resident beside this one (max_loaded_models), each a service of its own.
        self.residents = Residents(lambda: self.config, lambda side: InferenceService(
            side, events=self.events, batch_ids=self._batch_ids))
        self.budget = OwnerBudget(cfg.owner_tokens_per_minute)
        self.collector.on_request_finished.append(self._settle)

    def _new_loop(self, cfg: ServiceConfig, *, engine_loader: Callable[[], Engine] | None = None,
                  upstream: UpstreamServer | None = None) -> RequestLoop:
        """The loop for ``cfg``. A serving engine started as a child (vLLM, llama.cpp, ...) is
        served through as an upstream, by a loop that owns a new child (stopped with it: a
        switch or an unload ends the old child once its requests are done)."""
        self._child_start = None
        if cfg.engine not in MANAGED_ENGINES:
            return make_loop(cfg, self.collector, self.events, engine_loader=engine_loader, route=self.route,
                             batch_ids=self._batch_ids, upstream=upstream)
        child = ManagedServer(cfg.engine, cfg.model, command=cfg.serve_command, args=cfg.serve_args,
                              api_path=cfg.serve_api_path, start_timeout_s=cfg.serve_start_timeout_s,
                              max_model_len=cfg.max_model_len)
        loop = make_loop(replace(cfg, engine="openai", upstream_url=child.url, upstream_api_key=child.token,
                                 upstream_api_key_env=""),
                         self.collector, self.events, route=self.route, batch_ids=self._batch_ids, upstream=upstream)
        loop.child = child
        # A request that could not reach it waits for the restart, then goes again.
        loop.server.hold = lambda: child.wait_serving(cfg.serve_start_timeout_s)
        loop.server.advice = (f"It is the {cfg.engine} server this one runs (infer/status: child_server, its log "
                              f"{child.log_path})")
        return loop

    @property
    def child(self) -> ManagedServer | None:
        """The serving engine this service runs as a child, if it does."""
        return getattr(self._loop, "child", None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start loading the engine in the background (on the running event loop); requests
        wait until it is ready. Idempotent."""
        if self.child is not None and self._child_start is None:  # the loop starts once the child answers
            self._loop.expect("starting")
            self._child_start = asyncio.get_running_loop().create_task(self._start_child())
            return
        self._loop.start()
        self.models.start()

    async def _start_child(self) -> None:
        loop = self._loop
        try:
            await loop.child.start()
        except Exception as err:  # not installed, exited, timed out, or could not even be started
            loop.fail(str(err) if isinstance(err, RuntimeError) else f"{type(err).__name__}: {err}")
            return
        if loop is self._loop:  # (not switched away meanwhile)
            loop.start()
            self.models.start()

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        self.models.stop()
        await self.residents.stop()
        if self._child_start is not None:
            self._child_start.cancel()
        await self._loop.stop(reason)  # (a child's loop stops its child)

    async def close(self, reason: str) -> None:
        """Stop for good and drop the engine (a side model unloaded): its memory goes back."""
        await self.stop(reason)
        self._loop.release()

    def replace_loop(self, config: ServiceConfig) -> RequestLoop:
        """A loop for ``config`` in place of this one (requests now wait for it; it is not
        started); returns the old one, for the caller to drain and stop. The same config
        (an unload) keeps the loader it was given."""
        old = self._loop
        loader = self._engine_loader if config == self.config else None
        if self._child_start is not None and not self._child_start.done():
            self._child_start.cancel()  # a child still starting: the old loop's stop ends it
        self._loop = self._new_loop(config, engine_loader=loader)
        self._loop.expect()
        self.config, self.limits = config, self._loop.limits
        return old

    @property
    def started(self) -> bool:
        return self._loop.started

    @property
    def state(self) -> str:
        """``stopped`` | ``switching`` | ``loading`` | ``ready`` | ``failed``, ``unloaded`` (no
        model in memory: the next request loads it), ``unreachable`` for an upstream that
        does not answer now (it may come back; requests get 503 meanwhile), and ``restarting``
        for a managed child that died (requests wait for it)."""
        if self.models.unloaded:
            return "unloaded"
        state = self._loop.state
        if self.child is not None and state in ("ready", "unreachable") and not self.child.serving:
            return "restarting" if self.child.state == "ready" else self.child.state  # ready: died just now
        return state

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        await self.models.bring(None)  # an unloaded model comes back for whoever waits for it
        return await self._loop.wait_ready(timeout)

    async def wait_loaded(self) -> EngineInfo:
        """Until a model is ready, without bringing an unloaded one back."""
        return await self._loop.wait_ready()

    @property
    def info(self) -> EngineInfo | None:
        """What the engine serves, once it is loaded."""
        return self._loop.info

    # -- requests ---------------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Check ``request`` against the limits and queue it; raise ``InvalidRequest``,
        ``QueueFull`` or ``EngineUnavailable`` without queueing anything.

        A request with ``prompt_ids`` runs those tokens (checked against the vocabulary);
        otherwise ``prompt`` (or the rendered ``messages``) is tokenized. An upstream gets the
        chat as a chat, and the prompt's size is estimated. ``request`` is not changed: the
        loop prepares a resolved copy."""
        side = await self.models.resident(request.model)
        if side is not None:  # a model resident beside this one serves it
            return await side.submit(request)
        loop = self._loop
        async with contextlib.AsyncExitStack() as turn:
            try:
                # Unloaded, or another listed model on demand: its turn, held until it is queued.
                await turn.enter_async_context(self.models.turn(request.model))
                loop = self._loop  # one loop from here on: a switch meanwhile refuses it (below)
                info = await loop.wait_ready()  # (a child's loop is ready once the child first answered)
                if self.child is not None:  # restarting since: wait for it, not a 503
                    await self.child.wait_serving(self.config.serve_start_timeout_s)
                seq = await loop.prepare(request)
                if loop is not self._loop:
                    raise EngineUnavailable("The model was switched while this request was prepared; send it again.")
                # An open max_tokens (OpenAI's default: what the context leaves) reserves at most
                # OPEN_RESERVE of an owner's budget: it settles at what it really used.
                answer = seq.params.max_tokens if request.params.max_tokens is not None else \
                    min(seq.params.max_tokens, OPEN_RESERVE)
                self.budget.reserve(request.owner, seq.id, seq.num_prompt_tokens + answer, time.monotonic())
            except InferError as err:
                loop.recorder.rejected(refusal_reason(err.status))
                raise
            except Exception:  # a bug: the caller answers it; it still counts
                loop.recorder.rejected("error", "failed")
                raise
            try:
                stream = loop.submit(seq)
            except InferError:
                self.budget.settle(seq.id, 0)  # not queued: it cost nothing
                raise
        stream.model, stream.route = info.served_name, self.route
        return stream

    def _settle(self, record: RequestRecord) -> None:
        self.budget.settle(record.id, (record.prompt_tokens if record.first_token_at is not None else 0)
                           + record.completion_tokens)

    def knows(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued, running, or among the recently finished (an
        EventSource reconnecting after the end names one of those)."""
        return self._loop.knows(request_id) or any(s.knows(request_id) for s in self.residents.services())

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False if no such request is live."""
        return self._loop.cancel(request_id) or any(s.cancel(request_id) for s in self.residents.services())

    def owner_of(self, request_id: str) -> str | None:
        """Who sent a queued, running or recently finished request (``None``: no such request)."""
        owner = self._loop.owner_of(request_id)
        for side in self.residents.services():
            owner = owner if owner is not None else side.owner_of(request_id)
        return owner

    # -- the tokenizer ----------------------------------------------------------------------
    @property
    def has_tokenizer(self) -> bool:
        """Whether the tokenize routes work here (an upstream tokenizes on its own)."""
        return self._loop.tokenizes

    async def _tokenizer(self) -> Engine:
        await self._loop.wait_ready()
        return self._loop.tokenizer()

    async def tokenize(self, text: str) -> list[int]:
        """``text`` as the generate routes tokenize a prompt."""
        engine = await self._tokenizer()
        return await off_loop(engine.text.tokenize, check_text(text, "prompt"), size=len(text))

    async def render_chat(self, request: Request) -> str:
        """A chat request's prompt, as the chat route would run it (tools included)."""
        engine = await self._tokenizer()
        for message in request.messages or ():
            check_text(message["content"], "messages")
        return (await render_prompt(engine.text, request, engine.info.reasoning))[0]

    async def detokenize(self, token_ids: list[int]) -> str:
        engine = await self._tokenizer()
        check_token_ids(token_ids, engine.vocab_size, "tokens")
        return await off_loop(engine.text.detokenize, token_ids, size=len(token_ids))

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's own text (log probability answers name tokens by it)."""
        return self._loop.tokenizer().text.token_texts(token_ids)

    def reject(self, reason: str, *, outcome: str = "rejected") -> None:
        """Count a request refused (or, ``outcome="failed"``, failed) before it reached the
        service (e.g. a bad body)."""
        self._loop.recorder.rejected(reason, outcome)

    # -- views ------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return self._loop.counts()[0]

    @property
    def num_running(self) -> int:
        """Requests in the engine: decoding, or a long prompt being prefilled in chunks."""
        return self._loop.counts()[1]

    @property
    def reachable(self) -> bool | None:
        """Whether the upstream answers (``None``: not checked yet, or a local engine)."""
        return self._loop.reachable

    def prefix_cache(self) -> dict[str, Any] | None:
        """The engine's prefix cache: on or off, memory, hits, misses, reused tokens
        (``None`` while no engine is loaded, or for an engine without one)."""
        return self._loop.prefix_cache()

    def kv_cache(self) -> dict[str, Any] | None:
        """What the running rows hold in KV memory: bytes held, real tokens, bytes per token,
        and the waste ratio (padding and spare room; 1.0 is none). ``None`` for an engine
        that keeps no KV here (simulated, upstream)."""
        return self._loop.kv_cache()

    def subscribe(self) -> Subscription:
        """Live lifecycle events (``infer/events``); ``TooManySubscribers`` over the cap."""
        return self.events.subscribe()

    def status(self) -> dict[str, Any]:
        info, snap = self._loop.info, self._loop.snapshot()
        out = {
            "state": self.state,
            "load_error": self._loop.load_error,
            "mode": self.config.mode,
            # A managed child by its own name (llama.cpp, vllm), not the OpenAI client that reaches it.
            "engine": (self.config.engine if self.child is not None else info.engine) if info else None,
            "managed": self.child is not None,
            "model": info.served_name if info else None,
            "model_path": info.model if info else None,  # where its weights are (model: the name people see)
            "device": info.device if info else None,
            "dtype": info.dtype if info else None,
            "max_context": info.max_context if info else None,
            "fallback_reason": info.fallback_reason if info else None,
            "details": info.details if info else {},
            "sampling_defaults": info.sampling_defaults if info else {},
            "reasoning": info.reasoning if info else False,
            "tool_calls": info.tool_calls if info else None,
            "limits": {k: v for k, v in asdict(self.limits).items() if k != "mode"}
            | {"max_prompt_chars": None} | snap.limits,
            "queue_depth": len(snap.waiting),
            "running": len(snap.running),
            "parked": len(snap.parked),
            "prefix_cache": snap.prefix_cache,
            "kv_cache": snap.kv_cache,
            "configured": self._configured or self.config.given(),
            **({"child_server": self.child.status()} if self.child is not None else {}),
            **({"resident": self.residents.listing()} if self.residents.capacity else {}),
            **snap.status,
        }
        if self.route is not None:
            out["route"] = self.route
        return out

    def metrics(self) -> dict[str, Any]:
        """``GET infer/metrics``: aggregates since start."""
        snap = self._loop.snapshot()
        snapshot = self.collector.snapshot(queue_depth=len(snap.waiting), running=len(snap.running))
        snapshot["requests"]["parked"] = len(snap.parked)
        snapshot["events"] = self.events.stats()
        for owner, live in self._loop.owner_counts().items():
            snapshot["owners"][owner] = {**snapshot["owners"].get(owner, {}), **live}
        snapshot["prefix_cache"] = snap.prefix_cache
        snapshot["kv_cache"] = snap.kv_cache
        snapshot["structured_outputs"] = snap.status.get("structured_outputs")  # compiles, their times
        return snapshot

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """``GET infer/batches``: recent batch and request records, and who is running or
        waiting now; enough to draw a timeline of a past run. ``requests`` defaults to the
        records of those batches' members (four per batch)."""
        snap = self._loop.snapshot()
        records = self.collector.recent_batches(limit)
        if snap.open_batch is not None:  # the open one too, so a live timeline is current
            records = [*records[1 - limit:], snap.open_batch] if limit > 1 else [snap.open_batch]
        return {
            "batches": [b.to_json() for b in records],
            "requests": [r.to_json() for r in self.collector.request_records(requests or 4 * limit)],
            "running": snap.running,
            "waiting": snap.waiting,
            "parked": snap.parked,
            "mode": self.config.mode,
            "source": snap.source,
            "now": wall(time.monotonic()),
        }
