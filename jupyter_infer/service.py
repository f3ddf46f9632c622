"""``InferenceService``: the one request-level seam. Handlers, the embedded client, the bench,
the demo and loadgen talk to it and to nothing behind it.

``submit(request) -> stream``, ``cancel(id)``, ``status()``, ``metrics()``, ``batches()``,
``limits``: what an engine of any kind (local, simulated, an upstream server) has to offer.
A local engine runs under an ``EngineLoop``; ``engine = "openai"`` runs the same scheduling
core in front of an upstream server under an ``UpstreamLoop``; ``engine = "router"`` is a
``RouterService`` (``make_service`` picks) with this same public API over several of these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .config import ServiceConfig
from .engine import Engine, EngineInfo, load_engine
from .errors import InferError, InvalidRequest, refusal_reason
from .events import EventBus, Subscription
from .metrics import MetricsCollector, wall
from .request import Request, check_text
from .scheduler import EngineLoop, Recorder
from .sequence import Sequence
from .stream import RequestStream

if TYPE_CHECKING:
    from .router import RouterService
    from .upstream import UpstreamLoop, UpstreamServer

# Prompts longer than this are tokenized on a worker thread: tokenizing a long text can take
# long enough to stall every other handler of the Jupyter server.
TOKENIZE_INLINE_CHARS = 4096
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, and how batches are formed (``status()['limits']``)."""

    mode: str
    batch_window_ms: float
    max_batch_size: int
    max_queue_size: int
    max_new_tokens: int
    max_prompt_tokens: int
    max_prefill_tokens: int


def make_service(config: ServiceConfig) -> InferenceService | RouterService:
    """The service for ``config``: a ``RouterService`` for ``engine = "router"``."""
    if config.engine == "router":
        from .router import RouterService

        return RouterService(config)
    return InferenceService(config)


class InferenceService:
    """One engine (local or upstream) behind the front's queue.

    Behind a router, ``route`` names the backend on its records and events, ``parent`` is the
    router's collector (which sums every backend), ``events`` the router's bus and
    ``batch_ids`` the counter the backends share, so their batch records merge. ``upstream``
    replaces the upstream server of ``engine = "openai"`` (tests).
    """

    def __init__(
        self, config: ServiceConfig | None = None, *, engine_loader: Callable[[], Engine] | None = None,
        route: str | None = None, parent: MetricsCollector | None = None, events: EventBus | None = None,
        batch_ids: Iterator[int] | None = None, upstream: UpstreamServer | None = None,
    ) -> None:
        self.config = config or ServiceConfig()
        cfg = self.config
        if cfg.engine == "router":
            raise ValueError("InferenceService runs one engine; make_service(config) builds a router.")
        self.route = route
        self.limits = Limits(
            mode=cfg.mode, batch_window_ms=cfg.batch_window_ms, max_batch_size=cfg.batch_size,
            max_queue_size=cfg.max_queue_size, max_new_tokens=cfg.max_new_tokens,
            max_prompt_tokens=cfg.max_prompt_tokens, max_prefill_tokens=cfg.max_prefill_tokens,
        )
        self.collector = MetricsCollector(keep=cfg.keep_records, parent=parent)
        self.events = events or EventBus(capacity=cfg.event_buffer, max_subscribers=cfg.max_event_subscribers)
        self.upstream = cfg.engine == "openai"
        self._recorder = Recorder(cfg.mode, self.collector, self.events, route=route, batch_ids=batch_ids,
                                  source="upstream" if self.upstream else "engine")
        self._loop: EngineLoop | UpstreamLoop
        if self.upstream:
            from .upstream import UpstreamLoop

            self._loop = UpstreamLoop(cfg, self._recorder, upstream)
        else:
            self._loop = EngineLoop(engine_loader or (lambda: load_engine(cfg)), cfg, self._recorder)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start loading the engine in the background (on the running event loop); requests
        wait until it is ready. Idempotent."""
        self._loop.start()

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        await self._loop.stop(reason)

    @property
    def started(self) -> bool:
        return self._loop.started

    @property
    def state(self) -> str:
        """``stopped`` | ``loading`` | ``ready`` | ``failed``, and ``unreachable`` for an
        upstream that does not answer now (it may come back; requests get 503 meanwhile)."""
        state = self._loop.state
        if state == "ready" and self.reachable is False:
            return "unreachable"
        return state

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        return (await self._loop.wait_ready(timeout)).info

    @property
    def info(self) -> EngineInfo | None:
        """What the engine serves, once it is loaded."""
        return self._loop.info

    # -- requests ---------------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Check ``request`` against the limits and queue it; raise ``InvalidRequest``,
        ``QueueFull`` or ``EngineUnavailable`` without queueing anything.

        A request with ``prompt_ids`` runs those tokens (checked against the vocabulary)
        and gets their text as its ``prompt``; otherwise ``prompt`` (or the rendered
        ``messages``) is tokenized. An upstream gets the chat as a chat, and the prompt's size
        is estimated here."""
        try:
            backend = await self._loop.wait_ready()
            self._screen(request, backend)
            if self.upstream:
                self._check_upstream(request)
                from .upstream import estimate_tokens

                prompt_ids, prompt_tokens = [], estimate_tokens(request)
            else:
                if request.prompt_ids is not None:
                    prompt_ids = list(request.prompt_ids)
                    self._check_token_ids(prompt_ids, backend.vocab_size, "prompt")
                    request = replace(request, prompt=await self._off_loop(backend.detokenize, prompt_ids, size=len(prompt_ids)))
                else:
                    if request.messages is not None:
                        request = replace(request, prompt=await self._off_loop(
                            backend.render_chat, request.messages, size=sum(len(m["content"]) for m in request.messages)))
                    prompt_ids = await self._off_loop(backend.tokenize, request.prompt, size=len(request.prompt))
                self._check_token_ids([t for t, _ in request.params.logit_bias], backend.vocab_size, "logit_bias")
                prompt_tokens = len(prompt_ids)
            info = backend.info
            # Before the Sequence copies request.params: this resolves an open max_tokens there.
            request = self._check(request, prompt_tokens, info)
            seq = Sequence(request, prompt_ids, prompt_tokens=prompt_tokens)
        except InferError as err:
            self._recorder.rejected(refusal_reason(err.status))
            raise
        except Exception:  # a bug: the caller answers it; it still counts
            self._recorder.rejected("error", "failed")
            raise
        stream = self._loop.submit(seq)
        stream.model, stream.route = info.model, self.route
        return stream

    def knows(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued, running, or among the recently finished (an
        EventSource reconnecting after the end names one of those)."""
        return self._loop.knows(request_id)

    # -- the tokenizer ----------------------------------------------------------------------
    async def _tokenizer(self) -> Engine:
        engine = await self._loop.wait_ready()
        if self.upstream:
            raise InvalidRequest(
                "engine 'openai' has no tokenizer of its own: the upstream server tokenizes "
                "(ask its tokenize route, if it has one)."
            )
        return engine

    async def tokenize(self, text: str) -> list[int]:
        """``text`` as the generate routes tokenize a prompt."""
        engine = await self._tokenizer()
        return await self._off_loop(engine.tokenize, check_text(text, "prompt"), size=len(text))

    async def render_chat(self, messages: list[dict[str, str]]) -> str:
        """A chat as the prompt the chat route would run."""
        engine = await self._tokenizer()
        for message in messages:
            check_text(message["content"], "messages")
        return await self._off_loop(engine.render_chat, messages, size=sum(len(m["content"]) for m in messages))

    async def detokenize(self, token_ids: list[int]) -> str:
        engine = await self._tokenizer()
        self._check_token_ids(token_ids, engine.vocab_size, "tokens")
        return await self._off_loop(engine.detokenize, token_ids, size=len(token_ids))

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's own text (log probability answers name tokens by it)."""
        engine = self._loop.engine
        return [engine.detokenize([t]) for t in token_ids]

    @staticmethod
    def _check_token_ids(token_ids: list[int], vocab_size: int, name: str) -> None:
        bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(
                f"'{name}' holds the token id {bad}, outside this model's vocabulary "
                f"(0 to {vocab_size - 1}).", param=name,
            )

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False if no such request is live."""
        return self._loop.cancel(request_id)

    @staticmethod
    async def _off_loop(fn: Callable[[Any], T], arg: Any, *, size: int) -> T:
        """``fn(arg)`` (the tokenizer, the chat template), on a worker thread when ``arg`` is
        large. Whatever it raises on the text becomes a 400: it is the text that it cannot
        take (a Rust tokenizer's panic is even a ``BaseException``)."""
        try:
            if size <= TOKENIZE_INLINE_CHARS:
                return fn(arg)
            return await asyncio.to_thread(fn, arg)
        except (InferError, asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            log.warning("jupyter_infer: the tokenizer failed on a text", exc_info=err)
            raise InvalidRequest(
                f"The model's tokenizer could not read this text ({type(err).__name__}); "
                "check it for unusual characters.", param="prompt",
            ) from None

    def _screen(self, request: Request, backend: Any) -> None:
        """The checks that cost no tokenizing, run before it: the text is valid Unicode, and
        it is not longer than the longest prompt that could fit.

        No token stands for more than ``backend.max_token_chars`` characters, so a text of
        more than ``max_prompt_tokens * max_token_chars`` characters cannot tokenize into
        ``max_prompt_tokens`` tokens; refusing it by its length refuses nothing that fits.
        For a chat, the messages' text counts (the template only adds to it).
        """
        if request.prompt_ids is not None:
            return
        chat = request.messages is not None
        texts = [m["content"] for m in request.messages] if chat else [request.prompt]
        for text in texts:
            check_text(text, "messages" if chat else "prompt")
        bound = self.max_prompt_chars(backend)
        chars = sum(map(len, texts))
        if bound is not None and chars > bound:
            max_tokens = min(self.limits.max_prompt_tokens, backend.info.max_context)
            raise InvalidRequest(
                f"{'The messages have' if chat else 'The prompt has'} {chars:,} characters: more than "
                f"can fit in this server's limit of {max_tokens:,} tokens (InferApp.max_prompt_tokens, "
                f"and the model's context), as no token of this model stands for more than "
                f"{backend.max_token_chars} characters. Shorten it.", param="messages" if chat else "prompt",
            )

    def max_prompt_chars(self, backend: Any) -> int | None:
        """The longest text that could fit in ``max_prompt_tokens`` (None if unknown)."""
        per_token = getattr(backend, "max_token_chars", None)
        if per_token is None:
            return None
        return min(self.limits.max_prompt_tokens, backend.info.max_context) * per_token

    @staticmethod
    def _check_upstream(request: Request) -> None:
        """What an upstream (``engine = "openai"``) cannot do for us: it tokenizes itself, and
        its log probabilities are not passed back yet."""
        if request.prompt_ids is not None:
            raise InvalidRequest(
                "Token-id prompts need this server's tokenizer, and engine 'openai' forwards text: "
                "send the prompt as text.", param="prompt",
            )
        if request.params.logprobs is not None or request.params.prompt_logprobs is not None:
            raise InvalidRequest(
                "Log probabilities are not passed back from an upstream server (engine 'openai') "
                "yet: leave 'logprobs' and 'echo' out.", param="logprobs",
            )

    def _check(self, request: Request, prompt_tokens: int, info: EngineInfo) -> Request:
        """Every limit a request must meet, checked in this one place; resolves an open
        ``max_tokens`` to as many as fit."""
        limits, max_context = self.limits, info.max_context
        if request.model is not None and request.model not in info.model_names():
            raise InvalidRequest(
                f"The model {request.model!r} is not served here; use {info.model!r} "
                "(see GET infer/v1/models).", param="model",
            )
        if request.params.max_tokens is None:
            room = max_context - prompt_tokens
            request = replace(request, params=replace(request.params, max_tokens=max(1, min(limits.max_new_tokens, room))))
        max_tokens = request.params.max_tokens
        if max_tokens > limits.max_new_tokens:
            raise InvalidRequest(
                f"'max_tokens' is {max_tokens}, above this server's limit of "
                f"{limits.max_new_tokens} (InferApp.max_new_tokens). Ask for fewer tokens.",
                param="max_tokens",
            )
        if not prompt_tokens:
            raise InvalidRequest("The prompt is empty after tokenization: send some text.", param="prompt")
        if request.params.min_tokens > max_tokens:
            raise InvalidRequest(
                f"'min_tokens' ({request.params.min_tokens}) is above 'max_tokens' ({max_tokens}).",
                param="min_tokens",
            )
        if prompt_tokens > limits.max_prompt_tokens:
            about = "about " if self.upstream else ""  # an estimate: the upstream tokenizes
            raise InvalidRequest(
                f"The prompt has {about}{prompt_tokens} tokens, above this server's limit of "
                f"{limits.max_prompt_tokens} (InferApp.max_prompt_tokens). Shorten it.", param="prompt",
            )
        room = max_context - prompt_tokens
        if max_tokens > room:
            raise InvalidRequest(
                f"The prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"model's context of {max_context} tokens; ask for at most {max(room, 0)} tokens "
                "or shorten the prompt.", param="max_tokens",
            )
        return request

    def reject(self, reason: str, *, outcome: str = "rejected") -> None:
        """Count a request refused (or, ``outcome="failed"``, failed) before it reached the
        service (e.g. a bad body)."""
        self._recorder.rejected(reason, outcome)

    # -- views ------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        core = self._loop.scheduler
        return len(core.waiting) if core else 0

    @property
    def num_running(self) -> int:
        """Requests in the engine: decoding, or a long prompt being prefilled in chunks."""
        core = self._loop.scheduler
        return len(core.active) if core else 0

    def prefix_cache(self) -> dict[str, Any] | None:
        """The engine's prefix cache: on or off, memory, hits, misses, reused tokens
        (``None`` while no engine is loaded, or for an engine without one)."""
        engine = getattr(self._loop, "engine", None)  # an upstream has no engine of its own
        return engine.prefix_cache_stats() if engine else None

    def subscribe(self) -> Subscription:
        """Live lifecycle events (``infer/events``); ``TooManySubscribers`` over the cap."""
        return self.events.subscribe()

    def status(self) -> dict[str, Any]:
        info = self._loop.info
        out = {
            "state": self.state,
            "load_error": self._loop.load_error,
            "mode": self.config.mode,
            "engine": info.engine if info else None,
            "model": info.model if info else None,
            "device": info.device if info else None,
            "dtype": info.dtype if info else None,
            "max_context": info.max_context if info else None,
            "fallback_reason": info.fallback_reason if info else None,
            "details": info.details if info else {},
            # The chunk size in use is the engine's unless configured: known once it is loaded.
            "limits": {k: v for k, v in asdict(self.limits).items() if k != "mode"}
            | {"max_prompt_chars": self.max_prompt_chars(getattr(self._loop, "engine", None))}
            | ({"prefill_chunk_tokens": core.chunk_tokens} if (core := self._loop.scheduler) else {}),
            "queue_depth": self.queue_depth,
            "running": self.num_running,
            "prefix_cache": self.prefix_cache(),
            "configured": {"engine": self.config.engine, "model": self.config.model},
        }
        if self.upstream:
            out["upstream"] = self._loop.server.describe()
            out["timeline"] = ("upstream spans: a batch record is a set of requests in flight "
                               "upstream together; the upstream batches them its own way")
        if self.route is not None:
            out["route"] = self.route
        return out

    @property
    def reachable(self) -> bool | None:
        """Whether the upstream answers (``None``: not checked yet, or a local engine)."""
        return self._loop.server.reachable if self.upstream else None

    def metrics(self) -> dict[str, Any]:
        """``GET infer/metrics``: aggregates since start."""
        snapshot = self.collector.snapshot(queue_depth=self.queue_depth, running=self.num_running)
        snapshot["events"] = self.events.stats()
        snapshot["prefix_cache"] = self.prefix_cache()
        return snapshot

    def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """``GET infer/batches``: recent batch and request records, and who is running or
        waiting now; enough to draw a timeline of a past run. ``requests`` defaults to the
        records of those batches' members (four per batch)."""
        core = self._loop.scheduler
        records = self.collector.recent_batches(limit)
        if self._recorder.batch is not None:  # the open one too, so a live timeline is current
            records = [*records[1 - limit:], self._recorder.batch] if limit > 1 else [self._recorder.batch]
        return {
            "batches": [b.to_json() for b in records],
            "requests": [r.to_json() for r in self.collector.request_records(requests or 4 * limit)],
            "running": [s.id for s in core.active] if core else [],
            "waiting": [s.id for s in core.waiting] if core else [],
            "mode": self.config.mode,
            "source": "upstream" if self.upstream else "engine",
            "now": wall(time.monotonic()),
        }
