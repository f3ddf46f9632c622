"""``InferenceService``: the one request-level seam. Handlers, the embedded client, the bench,
the demo and loadgen talk to it and to nothing behind it.

``submit(request) -> stream``, ``cancel(id)``, ``status()``, ``metrics()``, ``batches()``,
``limits``: what an engine of any kind (local, simulated, an upstream server) has to offer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from .config import ServiceConfig
from .engine import Engine, EngineInfo, load_engine
from .errors import InferError, InvalidRequest, refusal_reason
from .events import EventBus, Subscription
from .metrics import MetricsCollector, wall
from .request import Request, check_text
from .scheduler import EngineLoop, Recorder, RequestStream, Sequence

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


class InferenceService:
    def __init__(
        self, config: ServiceConfig | None = None, *, engine_loader: Callable[[], Engine] | None = None,
    ) -> None:
        self.config = config or ServiceConfig()
        cfg = self.config
        self.limits = Limits(
            mode=cfg.mode, batch_window_ms=cfg.batch_window_ms, max_batch_size=cfg.batch_size,
            max_queue_size=cfg.max_queue_size, max_new_tokens=cfg.max_new_tokens,
            max_prompt_tokens=cfg.max_prompt_tokens, max_prefill_tokens=cfg.max_prefill_tokens,
        )
        self.collector = MetricsCollector(keep=cfg.keep_records)
        self.events = EventBus(capacity=cfg.event_buffer, max_subscribers=cfg.max_event_subscribers)
        self._recorder = Recorder(cfg.mode, self.collector, self.events)
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
        """``stopped`` | ``loading`` | ``ready`` | ``failed``."""
        return self._loop.state

    async def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        return (await self._loop.wait_ready(timeout)).info

    # -- requests ---------------------------------------------------------------------------
    async def submit(self, request: Request) -> RequestStream:
        """Check ``request`` against the limits and queue it; raise ``InvalidRequest``,
        ``QueueFull`` or ``EngineUnavailable`` without queueing anything."""
        try:
            engine = await self._loop.wait_ready()
            self._screen(request, engine)
            try:
                if request.messages is not None:
                    request.prompt = await self._off_loop(engine.render_chat, request.messages, size=sum(
                        len(m["content"]) for m in request.messages))
                prompt_ids = await self._off_loop(engine.tokenize, request.prompt, size=len(request.prompt))
            except (InferError, asyncio.CancelledError):
                raise
            except BaseException as err:  # a Rust tokenizer's panic is a BaseException
                if isinstance(err, (KeyboardInterrupt, SystemExit)):
                    raise
                log.warning("jupyter_infer: the tokenizer failed on a prompt", exc_info=err)
                raise InvalidRequest(
                    f"The model's tokenizer could not read this prompt ({type(err).__name__}); "
                    "check the text for unusual characters.", param="prompt",
                ) from None
            self._check(request, prompt_ids, engine.info.max_context)
        except InferError as err:
            self._recorder.rejected(refusal_reason(err.status))
            raise
        except Exception:  # a bug: the caller answers it; it still counts
            self._recorder.rejected("error", "failed")
            raise
        return self._loop.submit(Sequence(request, prompt_ids))

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False if no such request is live."""
        return self._loop.cancel(request_id)

    @staticmethod
    async def _off_loop(fn: Callable[[Any], T], arg: Any, *, size: int) -> T:
        if size <= TOKENIZE_INLINE_CHARS:
            return fn(arg)
        return await asyncio.to_thread(fn, arg)

    def _screen(self, request: Request, engine: Engine) -> None:
        """The checks that cost no tokenizing, run before it: the text is valid Unicode, and
        it is not longer than the longest prompt that could fit.

        No token stands for more than ``engine.max_token_chars`` characters, so a text of
        more than ``max_prompt_tokens * max_token_chars`` characters cannot tokenize into
        ``max_prompt_tokens`` tokens; refusing it by its length refuses nothing that fits.
        For a chat, the messages' text counts (the template only adds to it).
        """
        texts = [request.prompt] if request.messages is None else [m["content"] for m in request.messages]
        for text in texts:
            check_text(text, "prompt" if request.messages is None else "messages")
        bound = self.max_prompt_chars(engine)
        chars = sum(map(len, texts))
        if bound is not None and chars > bound:
            per_token = engine.max_token_chars
            max_tokens = min(self.limits.max_prompt_tokens, engine.info.max_context)
            what = "The prompt has" if request.messages is None else "The messages have"
            raise InvalidRequest(
                f"{what} {chars:,} characters: more than can fit in this server's limit of "
                f"{max_tokens:,} tokens (InferApp.max_prompt_tokens, and the model's context), as no "
                f"token of this model stands for more than {per_token} characters. Shorten it.",
                param="messages" if request.messages is not None else "prompt",
            )

    def max_prompt_chars(self, engine: Engine | None) -> int | None:
        """The longest text that could fit in ``max_prompt_tokens`` (None if unknown)."""
        if engine is None or engine.max_token_chars is None:
            return None
        return min(self.limits.max_prompt_tokens, engine.info.max_context) * engine.max_token_chars

    def _check(self, request: Request, prompt_ids: list[int], max_context: int) -> None:
        """Every limit a request must meet, checked in this one place; resolves an open
        ``max_tokens`` to as many as fit."""
        limits = self.limits
        if request.params.max_tokens is None:
            room = max_context - len(prompt_ids)
            request.params = replace(request.params, max_tokens=max(1, min(limits.max_new_tokens, room)))
        max_tokens = request.params.max_tokens
        if max_tokens > limits.max_new_tokens:
            raise InvalidRequest(
                f"'max_tokens' is {max_tokens}, above this server's limit of "
                f"{limits.max_new_tokens} (InferApp.max_new_tokens). Ask for fewer tokens.",
                param="max_tokens",
            )
        if not prompt_ids:
            raise InvalidRequest("The prompt is empty after tokenization: send some text.", param="prompt")
        if len(prompt_ids) > limits.max_prompt_tokens:
            raise InvalidRequest(
                f"The prompt has {len(prompt_ids)} tokens, above this server's limit of "
                f"{limits.max_prompt_tokens} (InferApp.max_prompt_tokens). Shorten it.", param="prompt",
            )
        room = max_context - len(prompt_ids)
        if max_tokens > room:
            raise InvalidRequest(
                f"The prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"model's context of {max_context} tokens; ask for at most {max(room, 0)} tokens "
                "or shorten the prompt.", param="max_tokens",
            )

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
        core = self._loop.scheduler
        return len(core.running) if core else 0

    def subscribe(self) -> Subscription:
        """Live lifecycle events (``infer/events``); ``TooManySubscribers`` over the cap."""
        return self.events.subscribe()

    def status(self) -> dict[str, Any]:
        engine = self._loop.engine
        info = engine.info if engine else None
        return {
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
            "limits": {**{k: v for k, v in asdict(self.limits).items() if k != "mode"},
                       "max_prompt_chars": self.max_prompt_chars(engine)},
            "queue_depth": self.queue_depth,
            "running": self.num_running,
            "configured": {"engine": self.config.engine, "model": self.config.model},
        }

    def metrics(self) -> dict[str, Any]:
        """``GET infer/metrics``: aggregates since start."""
        snapshot = self.collector.snapshot(queue_depth=self.queue_depth, running=self.num_running)
        snapshot["events"] = self.events.stats()
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
            "running": [s.id for s in core.running] if core else [],
            "waiting": [s.id for s in core.waiting] if core else [],
            "mode": self.config.mode,
            "now": wall(time.monotonic()),
        }
