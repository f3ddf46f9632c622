"""The async engine loop: the engine's one thread, and the request streams.

Each turn asks the scheduling core for a plan, runs it on the engine thread
(``Engine.execute``: the engine keeps its rows), hands its outputs to the core, then each row's
tokens to the answer stage (which appends them, ends requests and reads their answers), pushes
what each answer gained to its stream, and closes the step with the core. It owns the executor
and the streams,
and nothing else: what to run is the core's decision, what happened is the recorder's to
tell.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..constraints.grammar import Grammar, compile_in_time
from ..cpu.process_memory import release_freed
from ..engine import Engine
from ..errors import InvalidRequest
from ..formats.model_catalog import short_name
from ..scheduler.scheduler import Scheduler
from ..values.engine_info import EngineInfo
from ..values.limits import check_model, check_token_ids
from ..values.load_progress import LoadProgress, reporting
from ..values.sequence import Sequence
from ..values.sizes import readable_bytes, weights_format
from ..values.step import Sampled, StepPlan
from .answer_stage import AnswerStage
from .request_loop import LoopSnapshot, RequestLoop
from .tokenizing import off_loop, render_prompt

if TYPE_CHECKING:
    from ..scheduler.recorder import Recorder
    from ..values.config import ServiceConfig
    from ..values.request import Constraint, Request, TokenEvent

log = logging.getLogger(__name__)


class EngineLoop(RequestLoop):
    # Once nothing has run for this long, the loop hands the heap's freed pages back to the
    # system (glibc keeps them: ~70 MB after a few bursts on the 0.5b shape in int4, each burst
    # growing it; the trim costs ~8 ms, so never between two requests that follow each other).
    IDLE_TRIM_S = 1.0

    def __init__(
        self, load: Callable[[], Engine], config: ServiceConfig, recorder: Recorder, *, check_model: bool = True,
    ) -> None:
        super().__init__(config, recorder, check_model=check_model)
        self._load = load
        self.engine: Engine | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stepped_at: float | None = None  # when the last step ended, until the heap is trimmed
        self.progress: LoadProgress | None = None  # how loading goes (and went), once started

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo | None:
        return self.engine.info if self.engine else None

    async def stop(self, reason: str = "the inference server is shutting down") -> None:
        """Stop the loop; every queued or running request ends with an error. Returns once a
        step that was running on the engine thread has ended."""
        task, self._task = self._task, None
        self._stop_reason = reason
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._abort_all(reason)
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        if self.engine is not None:
            self.engine.drop_rows()  # the step that held them has ended
            await asyncio.to_thread(self.engine.close)
        self._state = "stopped"

    def release(self) -> None:
        """Drop the engine (a stopped loop whose model was switched or unloaded): its memory
        goes back once nothing else holds it."""
        self.engine = self.scheduler = None
        self.answers = AnswerStage()

    # -- requests ---------------------------------------------------------------------------
    async def prepare(self, request: Request) -> Sequence:
        """Tokenize ``request`` (or take its token ids, checked against the vocabulary, and
        their text as its prompt; or render its chat) and check it against the limits."""
        await self.wait_ready()
        engine, limits = self.engine, self.limits
        text = engine.text
        check_task(request, engine)
        limits.screen(request, text.max_token_chars, engine.info.max_context)
        request, prompt_ids = await self._prompt_ids(request)
        check_token_ids([t for t, _ in request.params.logit_bias], engine.vocab_size, "logit_bias")
        if self.check_model:
            check_model(request, engine.info)
        request = limits.check(request, len(prompt_ids), engine.info.max_context)
        seq = Sequence(request, prompt_ids)
        if request.params.constraint is not None:
            seq.grammar = await self._grammar(request.params.constraint)
        return seq

    async def _prompt_ids(self, request: Request) -> tuple[Request, list[int]]:
        """The tokens a request runs, and the request with its prompt as text: its token ids
        (checked against the vocabulary), its rendered chat, a cross-encoder's pair, an infill
        in the model's fill-in-the-middle tokens, or its prompt."""
        engine, text = self.engine, self.engine.text
        if request.prompt_ids is not None:
            prompt_ids = list(request.prompt_ids)
            check_token_ids(prompt_ids, engine.vocab_size, "prompt")
            return replace(request, prompt=await off_loop(text.detokenize, prompt_ids, size=len(prompt_ids))), prompt_ids
        if request.pair is not None:
            pair = request.pair
            return request, await off_loop(lambda first: text.tokenize_pair(first, pair), request.prompt,
                                           size=len(request.prompt) + len(pair))
        if request.messages is not None:
            prompt, constraint, opened = await render_prompt(text, request, engine.info.reasoning)
            request = replace(request, prompt=prompt, params=replace(request.params, constraint=constraint),
                              opened_reasoning=opened)
        elif request.suffix is not None:
            request = replace(request, prompt=text.infill_prompt(
                request.prompt, request.suffix, request.context_files, model=f"The model {engine.info.model}"))
        return request, await off_loop(text.tokenize, request.prompt, size=len(request.prompt))

    async def _grammar(self, constraint: Constraint) -> Grammar:
        """The compiled constraint, waited for here, before the queue: no step waits on it."""
        if self.engine.grammars is None:
            raise InvalidRequest(f"The {self.engine.info.engine} engine cannot constrain its answers "
                                 f"({constraint.describe()}).")
        return await compile_in_time(self.engine.grammars, constraint, self.config.grammar_timeout_s)

    def tokenizer(self) -> Engine:
        return self.engine

    def tool_format(self) -> str:
        return self.engine.text.tool_format.name

    # -- views ------------------------------------------------------------------------------
    def prefix_cache(self) -> dict[str, Any] | None:
        return self.engine.prefix_cache_stats() if self.engine is not None else None

    def kv_cache(self) -> dict[str, Any] | None:
        # Read while a step may run on the engine thread: a gauge, off by a step at most.
        usage = self.engine.kv_usage() if self.engine is not None else None
        return usage.to_json() if usage is not None else None

    def snapshot(self) -> LoopSnapshot:
        snap = super().snapshot()
        engine = self.engine
        if self.scheduler is not None:  # the chunk in use is the engine's unless configured
            snap.limits["prefill_chunk_tokens"] = self.scheduler.chunk_tokens
        if engine is not None:
            snap.prefix_cache, snap.kv_cache = self.prefix_cache(), self.kv_cache()
            snap.limits["max_prompt_chars"] = self.limits.max_prompt_chars(engine.text.max_token_chars,
                                                                           engine.info.max_context)
            if engine.grammars is not None:
                snap.status["structured_outputs"] = engine.grammars.stats()
            snap.status["speculative"] = {"method": engine.speculative_method,
                                          "max_tokens": engine.speculative_tokens,
                                          "max_rows": engine.speculative_max_rows,
                                          "draft_model": engine.info.details.get("draft_model")}
        if engine is not None and engine.cpu_share is not None:  # its threads, and whether it is starved
            snap.status["cpu"] = engine.cpu_share.snapshot()
        if self.progress is not None:  # while loading: how far; once done: what it took
            snap.status["loading"] = self.progress.snapshot()
        return snap

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jupyter-infer-engine")
        try:
            self.progress = LoadProgress(self._what_loads(), log=lambda line: log.info("jupyter_infer | %s", line))
            self.engine = await loop.run_in_executor(self._executor, self._load_reporting, self.progress)
            # The load leaves garbage (cycles through its modules and tensors): one full
            # collection now, before any request, not a quarter-second one under the first
            # burst (the server then freezes what is left: server/startup_heap).
            await loop.run_in_executor(self._executor, gc.collect)
            self.scheduler = Scheduler(self.config, self.engine, self.recorder)
            self.answers = AnswerStage(self.engine.text)
            if self.engine.grammars is not None:
                self.engine.grammars.fast_forward = self.config.grammar_fast_forward
            cfg = self.config
            self.engine.configure_speculation(cfg.speculation, cfg.speculative_tokens, cfg.speculative_max_rows)
            name_served(self.engine.info, cfg)
            self._state = "ready"
        except Exception as err:
            self._state, self.load_error = "failed", f"{type(err).__name__}: {err}"
            log.error("jupyter_infer: the engine failed to load: %s", self.load_error)
        finally:
            self._ready.set()
        if self._state != "ready":
            return
        log.info("jupyter_infer | ready: %s", ready_line(self.engine.info, self.progress))
        self.recorder.ready(self.engine.info)
        core = self.scheduler
        while True:
            plan, wake_at = core.schedule(time.monotonic())
            self._end_finished()
            if plan is None:
                await self._idle(wake_at)
                continue
            started = time.monotonic()
            try:
                sampled = await loop.run_in_executor(self._executor, self.engine.execute, plan)
                if not plan.ids:
                    continue  # it only freed the rows that left
            except Exception as err:
                self._fail(plan, err, in_engine=True)
                continue
            finally:
                self._stepped_at = time.monotonic()
            try:
                taken = take_step(core, self.answers, plan, sampled, started, time.monotonic())
            except Exception as err:  # a bug here must not stop the loop for everyone
                self._fail(plan, err, in_engine=False)
                continue
            for seq, _, event in taken:
                if event is not None:
                    self._streams[seq.id].push(event)
            self._end_finished()

    def _load_reporting(self, progress: LoadProgress) -> Engine:
        """The engine, loaded on this (the engine's) thread, its loaders reporting to ``progress``."""
        try:
            with reporting(progress):
                engine = self._load()
        except BaseException:
            progress.finish(failed=True)
            raise
        progress.finish()
        return engine

    def _what_loads(self) -> str:
        return "the simulated engine" if self.config.engine == "simulated" else self.config.model

    async def _idle(self, wake_at: float | None) -> None:
        """Wait for work; once nothing has run for ``IDLE_TRIM_S``, trim the heap first (on the
        engine's thread: the server's event loop never waits for it)."""
        if not self.scheduler.running and not self.scheduler.parked and self._stepped_at is not None:
            due = self._stepped_at + self.IDLE_TRIM_S
            if time.monotonic() >= due:
                self._stepped_at = None
                await asyncio.get_running_loop().run_in_executor(self._executor, release_freed)
                return
            wake_at = due if wake_at is None else min(wake_at, due)
        await self._wait(wake_at)

    def _fail(self, plan: StepPlan, err: Exception, *, in_engine: bool) -> None:
        log.error("jupyter_infer: engine step %s (%s) failed", plan.step_id, plan.kind, exc_info=err)
        message = f"The engine failed while running this request: {type(err).__name__}: {err}"
        self.scheduler.fail(plan, message, time.monotonic(), retry=in_engine)
        self._end_finished()


def name_served(info: EngineInfo, config: ServiceConfig) -> None:
    """What people see of the loaded model: its listing's short name (a model under
    ``model_dirs``), and its context capped at ``max_model_len``."""
    if info.engine != "simulated" and info.name is None:
        info.name = short_name(info.model, config.model_dirs)
    if config.max_model_len:
        info.max_context = min(info.max_context, config.max_model_len)


def check_task(request: Request, engine: Engine) -> None:
    """A 400 before the queue for what this engine's model cannot do: embeddings from an
    engine without them, an answer from an embedding model."""
    model = engine.info.model
    if request.embed and not engine.embeds:
        raise InvalidRequest(f"The {engine.info.engine} engine ({model}) cannot compute embeddings.", param="model")
    scores = engine.info.details.get("task") == "rerank"
    if request.embed and scores != (request.pair is not None):
        raise InvalidRequest(f"{model} is a reranker (a cross-encoder): it scores a query with each document "
                             "(infer/v1/rerank) and gives no embeddings." if scores else
                             f"{model} gives embeddings, not a cross-encoder's scores.", param="model")
    if not request.embed and not engine.generates:
        raise InvalidRequest(f"{model} is an embedding model: it writes no answers. Ask it for embeddings "
                             "(infer/v1/embeddings), or load a chat model for this.", param="model")


def take_step(core: Scheduler, answers: AnswerStage, plan: StepPlan, sampled: Sampled, started: float,
              now: float) -> list[tuple[Sequence, list[int], TokenEvent | None]]:
    """A step's outputs: the core applies what the step computed, the answer stage takes each
    row's tokens (ending rows), the core closes the step. Returns, per live row that got
    tokens, the tokens kept and what its answer gained (``None``: nothing to tell yet)."""
    kept, taken = [], []
    for seq, output in core.apply(plan, sampled, now):
        first = seq.record.first_token_at is None
        tokens, event = answers.take(seq, output.tokens, output.logprobs, now)
        core.recorder.token(seq, event.text if event is not None else "", first)
        kept.append((seq, output, tokens))
        taken.append((seq, tokens, event))
    core.close_step(plan, sampled, kept, started, now)
    return taken


def ready_line(info: EngineInfo, progress: LoadProgress) -> str:
    """What was loaded, in one log line: the model, its format, its bytes, the machine's share."""
    d = info.details
    if info.engine != "hf":
        return f"{info.model} ({info.engine} engine) in {progress.snapshot()['elapsed_s']} s"
    held = weights_format(d, info.dtype)
    count = d.get("parameters", 0)
    count = f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"
    parts = [f"{info.model}: {d.get('architecture', '?')}, {count} parameters as {held} on {info.device}"]
    if d.get("weight_bytes"):
        parts.append(f"{readable_bytes(d['weight_bytes'])} of weights")
    if d.get("rss_after_load_bytes"):
        parts.append(f"{readable_bytes(d['rss_after_load_bytes'])} resident")
    if d.get("num_threads"):
        parts.append(f"{d['num_threads']} threads")
    if d.get("linear_kernels"):
        parts.append(f"linears: {d['linear_kernels']}")
    return ", ".join(parts) + f"; loaded in {progress.snapshot()['elapsed_s']} s"

