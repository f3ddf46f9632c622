"""The scheduling core: which sequences run next, and what a step's tokens do to them.

Synchronous and free of I/O, like nano-vllm's ``Scheduler``: the engine loop calls
``schedule(now)`` for a ``StepPlan`` (prefill newcomers, or decode one token for every
running row), runs it, and hands the tokens to ``postprocess``. Time comes in as ``now``,
so the policy can be tested with a fake clock. Every sequence that ends (finished,
cancelled, failed) is collected for the loop, which ``pop_finished()``s it to end its stream.

Chunked prefill (continuous mode, ``prefill_chunk_tokens``): a prompt longer than a chunk is
admitted alone as the one PREFILLING sequence, and each prefill turn runs its next chunk
(the engine continues the row's KV, which the loop holds) until the last chunk yields its
first token and it joins the running rows. Between two chunks the running rows decode, so
a long prompt stalls them for one chunk at a time, never for its whole prefill; and while
rows run, a group prefill of short prompts is bounded by a chunk too.

State transitions: WAITING → RUNNING → FINISHED, WAITING → PREFILLING → RUNNING for a long
prompt, and WAITING → FINISHED for a request cancelled in the queue. Lifecycle facts go to
the ``Recorder``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..engine import Sampled, StepPlan
from ..errors import QueueFull
from ..sequence import Sequence, Status
from .recorder import Recorder

if TYPE_CHECKING:
    from ..config import ServiceConfig
    from ..engine import Engine

DECODES_PER_PREFILL = 1  # decode steps the running rows get between two prefills


class Scheduler:
    def __init__(self, config: ServiceConfig, engine: Engine | None, recorder: Recorder) -> None:
        self.config = config
        self.engine = engine  # read for detokenize and EOS only (None upstream): steps run in the loop
        self.recorder = recorder
        self.max_batch_size = config.batch_size
        self.prefill_budget: int | None = config.max_prefill_tokens  # None: no budget
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.prefilling: Sequence | None = None  # the long prompt being prefilled in chunks
        # The classic window batcher runs whole batches; chunks need an engine that can.
        own = getattr(engine, "prefill_chunk_tokens", 0)
        wanted = own if config.prefill_chunk_tokens is None else config.prefill_chunk_tokens
        self.chunk_tokens = wanted if config.mode == "continuous" and own else 0
        self._live: dict[str, Sequence] = {}
        self._finished: list[Sequence] = []
        self._window_opened: float | None = None
        self._last_arrival = 0.0
        self._decodes_since_prefill = 0
        self._step_ids = itertools.count(1)

    # -- requests ---------------------------------------------------------------------------
    def add(self, seq: Sequence, now: float) -> None:
        """Queue ``seq``; raise ``QueueFull`` (queueing nothing) when the queue is full."""
        if len(self.waiting) >= self.config.max_queue_size:
            self.recorder.rejected("queue_full")
            raise QueueFull(
                f"The queue is full ({self.config.max_queue_size} waiting requests). Retry "
                "shortly, or raise InferApp.max_queue_size.", retry_after=1.0,
            )
        if not self.waiting:  # the first request into an empty queue opens the window
            self._window_opened = now
        self._last_arrival = now
        self.waiting.append(seq)
        self._live[seq.id] = seq
        self.recorder.queued(seq, len(self.waiting))

    def cancel(self, request_id: str, now: float) -> bool:
        """Cancel a request: dropped now if queued, at the next step if running."""
        seq = self._live.get(request_id)
        if seq is None:
            return False
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
            self._finish(seq, "cancelled", now)
        else:
            seq.cancelled = True
        return True

    def abort(self, reason: str, now: float) -> None:
        """Every queued and running request ends with ``reason`` (the service stops)."""
        for seq in self.waiting + self.active:
            self._finish(seq, "failed", now, error=reason)
        self.waiting.clear()
        self.running.clear()
        self.prefilling = None
        self.recorder.left([], now)

    def pop_finished(self) -> list[Sequence]:
        finished, self._finished = self._finished, []
        return finished

    @property
    def active(self) -> list[Sequence]:
        """Every sequence the engine holds a row of: the running ones, then the prefilling one."""
        return self.running + ([self.prefilling] if self.prefilling is not None else [])

    @property
    def has_cancelled(self) -> bool:
        return any(s.cancelled for s in self.active)

    # -- decisions --------------------------------------------------------------------------
    def schedule(self, now: float) -> tuple[StepPlan | None, float | None]:
        """The next step, or ``(None, wake_at)``: nothing to run before ``wake_at`` (``None``:
        until something arrives)."""
        cancelled = [s for s in self.active if s.cancelled]
        if cancelled:
            for seq in cancelled:
                self._retire(seq, "cancelled", now)
            self.recorder.left(self.active, now)
        staying = [s.id for s in self.running]
        newcomers, wake_at = self._admit(now)
        if newcomers:
            self._decodes_since_prefill = 0
            chunk = self.chunk_tokens if newcomers[0] is self.prefilling else 0
            return StepPlan(next(self._step_ids), "prefill", newcomers, staying, chunk), None
        if self.running:
            self._decodes_since_prefill += 1
            return StepPlan(next(self._step_ids), "decode", list(self.running), staying), None
        return None, wake_at

    def _admit(self, now: float) -> tuple[list[Sequence], float | None]:
        cfg = self.config
        if self.prefilling is not None:  # its next chunk, once the running rows had a step
            if self.running and not self._may_join():
                return [], None
            return [self.prefilling], None
        if not self.waiting:
            return [], None
        if cfg.mode == "window" and self.running:
            return [], None  # the classic batcher runs a batch to completion
        if self.running:
            if not self._may_join():
                return [], None
        else:
            # An idle engine waits for the window (window mode), or a few ms (continuous):
            # a burst landing over some ms then shares one prefill instead of two.
            if self._window_opened is None:
                self._window_opened = now
            if cfg.mode == "window":
                deadline = self._window_opened + cfg.batch_window_ms / 1000
            else:
                quiet = cfg.idle_admit_delay_ms / 1000
                deadline = min(self._window_opened + 10 * quiet, self._last_arrival + quiet)
            if len(self.waiting) < self.max_batch_size and now < deadline:
                return [], deadline
        newcomers = self._pick(self.max_batch_size - len(self.running))
        if not newcomers:
            return [], None
        admitted = set(map(id, newcomers))
        self.waiting = [s for s in self.waiting if id(s) not in admitted]
        # Leftovers of a window batch open the next window now.
        self._window_opened = now if self.waiting else None
        if self._chunked(newcomers[0]):
            self.prefilling, newcomers[0].status = newcomers[0], Status.PREFILLING
            self.recorder.admitted(newcomers, self.active, now)
            return newcomers, None
        for seq in newcomers:
            seq.status = Status.RUNNING
        self.running.extend(newcomers)
        self.recorder.admitted(newcomers, self.running, now)
        return newcomers, None

    def _may_join(self) -> bool:
        """Whether newcomers may join running rows now: after the running streams made
        progress since the last prefill."""
        return self._decodes_since_prefill >= DECODES_PER_PREFILL

    def _chunked(self, seq: Sequence) -> bool:
        # A request for its prompt's logprobs needs every prompt position's logits at once.
        return 0 < self.chunk_tokens < seq.num_prompt_tokens and seq.params.prompt_logprobs is None

    def _pick(self, room: int) -> list[Sequence]:
        """Highest priority first, FIFO within a priority, within the prefill budget; a
        prompt to chunk goes alone."""
        budget = self.prefill_budget
        if self.running and self.chunk_tokens:  # what the running rows wait for, at most
            budget = self.chunk_tokens if budget is None else min(budget, self.chunk_tokens)
        newcomers: list[Sequence] = []
        longest = 0
        for seq in sorted(self.waiting, key=lambda s: s.priority_key):
            if len(newcomers) >= room or (newcomers and (seq.alone or newcomers[0].alone)):
                break
            if self._chunked(seq):
                if not newcomers:
                    newcomers.append(seq)
                break
            longest_if = max(longest, seq.num_prompt_tokens)
            if newcomers and budget is not None and longest_if * (len(newcomers) + 1) > budget:
                break  # padded prefill over budget; the rest waits for the next prefill
            newcomers.append(seq)
            longest = longest_if
        return newcomers

    # -- results ----------------------------------------------------------------------------
    def postprocess(
        self, plan: StepPlan, sampled: Sampled, started: float, now: float,
    ) -> list[tuple[Sequence, int, str]]:
        """Apply a step's tokens (and the log probabilities of the rows that asked); return
        ``(sequence, token, text it releases)`` per live row.

        A chunk that did not finish its prompt yields no token; the one that does moves its
        sequence from prefilling to the running rows (the engine appended its row)."""
        engine = self.engine
        out: list[tuple[Sequence, int, str]] = []
        if plan.chunk:
            seq = plan.seqs[0]
            if not sampled.tokens:
                self.recorder.step(plan, 0, started, now)
                return out
            if seq is self.prefilling:
                self.prefilling, seq.status = None, Status.RUNNING
                self.running.append(seq)
        logprobs = sampled.logprobs
        prompt_logprobs = sampled.prompt_logprobs if plan.kind == "prefill" else None
        for row, (seq, token) in enumerate(zip(plan.seqs, sampled.tokens, strict=True)):
            if seq.status is not Status.RUNNING or seq.cancelled:
                continue
            if prompt_logprobs is not None and prompt_logprobs[row] is not None:
                seq.prompt_logprobs = prompt_logprobs[row]
            first = seq.record.first_token_at is None
            fragment = seq.append(
                token, engine.detokenize, engine.eos_token_ids, now, logprobs[row] if logprobs else None
            )
            self.recorder.token(seq, fragment, first)
            out.append((seq, token, fragment))
        self.recorder.step(plan, len(out), started, now)
        done = [seq for seq, _, _ in out if seq.finish_reason is not None]
        for seq in done:
            self._retire(seq, "ok", now)
        if done:
            self.recorder.left(self.active, now)
        return out

    def fail(self, plan: StepPlan, error: str, now: float, *, retry: bool = True) -> None:
        """A step failed: only its requests fail, and the loop goes on.

        A failed prefill of several newcomers fails none of them yet: each is retried in a
        prefill of its own, so one bad prompt cannot take down the requests admitted with
        it. After a failed decode every running row fails: its batch state is unknown.
        """
        if plan.kind == "prefill" and retry and len(plan.seqs) > 1:
            again = []
            for seq in plan.seqs:
                if seq.status is not Status.RUNNING:
                    continue
                self.running.remove(seq)
                if seq.cancelled:  # cancelled meanwhile: it ends here, it is not run again
                    self._finish(seq, "cancelled", now)
                    continue
                seq.status, seq.alone = Status.WAITING, True
                again.append(seq)
            self.waiting[:0] = again
            self.recorder.left(self.active, now)
            return
        failed = plan.seqs if plan.kind == "prefill" else list(self.running)
        for seq in failed:
            if seq.status in (Status.RUNNING, Status.PREFILLING):
                self._retire(seq, "failed", now, error=error)
        self.recorder.left(self.active, now)

    def _retire(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        if seq is self.prefilling:
            self.prefilling = None
        else:
            self.running.remove(seq)
        self._finish(seq, outcome, now, error)

    def _finish(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        seq.status = Status.FINISHED
        rec = seq.record
        rec.outcome, rec.finished_at, rec.error = outcome, now, error
        if outcome == "cancelled":
            rec.finish_reason = "cancelled"
        del self._live[seq.id]
        self.recorder.finished(seq)
        self._finished.append(seq)
