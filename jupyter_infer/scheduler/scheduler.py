"""The scheduling core: which sequences run next, and what a step's tokens do to them.

Synchronous and free of I/O, like nano-vllm's ``Scheduler``: the engine loop calls
``schedule(now)`` for a ``StepPlan`` (a token for every decoding row, and newcomers' prompt
tokens: in the same step where the engine mixes, else in a prefill step of their own), runs
it, hands what it computed to ``apply``, the tokens to the output stage (which appends them
and decides when one ends a request: ``loops/output_stage.py``), and closes the step
(``close_step``). Time comes in as ``now``,
so the policy can be tested with a fake clock. The requests live in a ``RequestQueue``
(``queue``), which collects every sequence that ends (finished, cancelled, failed) until the
loop takes it (``queue.pop_finished()``) to end its stream.

One rule, as in vLLM v1: each step schedules some tokens of some sequences, and their
``num_computed`` catches up with their tokens: a whole prompt, a chunk of a long one, or the
last output token of every decoding row; in one step (a mixed one) where the engine can.
Chunked prefill (continuous mode, ``prefill_chunk_tokens``) is that rule with a budget: a
prompt longer than a chunk is admitted alone, and while rows decode each step schedules its
next chunk until the last one yields its first token (with none decoding, all that remains at
once). The chunk rides in the decoding rows' step (or, on an engine that cannot mix, between
two of them), so a long prompt stalls them for one chunk at a time, never for its whole
prefill; and while rows run, newcomers' prompts in one step are bounded by a chunk too.
Speculation is the same rule's policy too: the plan says how many draft tokens each decoding
row may propose (``speculative.guessing.Guesses``, following each row's acceptance), the
engine verifies them in the step, and the ones its model agreed with count as computed.

Fair share between owners (``fair_share``, on by default): the rows go to the owners (the
Jupyter or hub users who sent the requests) in turn, each owner's by priority then FIFO. The
next row goes to the owner holding the fewest rows for its weight (``fair.Owners``); and when
every row is taken, a newcomer whose owner holds fewer than another owner's rows minus one
takes the place of that owner's newest decoding row, which is *parked*: its KV stays in the
engine, it sits out the steps, and it resumes, exactly where it was, when its owner's turn
comes again. So a user with one request never waits for another's burst to drain.

State transitions: WAITING → RUNNING → FINISHED, RUNNING ⇄ PARKED, and WAITING (or PARKED)
→ FINISHED for a request cancelled there. Lifecycle facts go to the ``Recorder``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..errors import ConstraintFailed
from ..speculative.guessing import Guesses
from ..values.sequence import Sequence, Status
from ..values.step import RowOutput, Sampled, StepPlan
from .recorder import Recorder
from .request_queue import QueuedCore, RequestQueue

if TYPE_CHECKING:
    from ..engine import Engine
    from ..values.config import ServiceConfig

DECODES_PER_PREFILL = 1  # decode steps the running rows get between two prefills


class Scheduler(QueuedCore):
    def __init__(self, config: ServiceConfig, engine: Engine, recorder: Recorder) -> None:
        self.config = config
        self.engine = engine  # read for its settings only: steps run in the loop, text in the output stage
        self.recorder = recorder
        self.queue = RequestQueue(config, recorder)  # waiting, running, parked; every request's end
        self.max_batch_size = config.batch_size
        self.prefill_budget: int | None = config.max_prefill_tokens  # None: no budget
        # Parking keeps a row's KV aside while another owner has its place.
        self.can_park = config.fair_share and config.mode == "continuous"
        # The classic window batcher runs whole batches; chunks need an engine that can.
        own = getattr(engine, "prefill_chunk_tokens", 0)
        wanted = own if config.prefill_chunk_tokens is None else config.prefill_chunk_tokens
        self.chunk_tokens = wanted if config.mode == "continuous" and own else 0
        # The most prompt tokens one step computes for a prompt alone (0: all of it): a long
        # prompt's activations are a few of its rows at a time, not all (the engine's choice).
        self.prompt_step_tokens = getattr(engine, "prefill_step_tokens", 0) if self.chunk_tokens else 0
        # Newcomers' prompts ride in the decoding rows' step (one forward) where the engine can;
        # else a prefill waits for the decoding rows' next step (DECODES_PER_PREFILL).
        self.mixes = getattr(engine, "mixes_steps", False) and config.mode == "continuous"
        self._decodes_since_prefill = 0
        self._step_ids = itertools.count(1)
        self._parking: list[str] = []  # rows parked, and resumed, since the last plan
        self._resuming: list[str] = []
        # The rows the engine may hold, planned and not yet released (vLLM's scheduler keeps
        # its requests so): a plan names its rows by id, and its outputs come back to these.
        self._held: dict[str, Sequence] = {}
        self.guesses = Guesses()  # who speculates, and how many (speculation the engine runs)
        self._embedded: list[Sequence] = []  # embedding rows a step completed: they end with it

    # -- requests ---------------------------------------------------------------------------
    @property
    def parked(self) -> list[Sequence]:
        """Admitted rows sitting out while another owner has their place; their KV stays."""
        return self.queue.parked

    def _cancel_running(self, seq: Sequence, now: float) -> None:
        """A running row leaves at the next step (its KV goes with that plan's ``finished``)."""
        seq.cancelled = True

    @property
    def decoding(self) -> list[Sequence]:
        """The running rows whose prompt is all computed, in the order they joined."""
        return [s for s in self.running if not s.prefilling]

    # -- decisions --------------------------------------------------------------------------
    def schedule(self, now: float) -> tuple[StepPlan | None, float | None]:
        """The next step, or ``(None, wake_at)``: nothing to run before ``wake_at`` (``None``:
        until something arrives). A plan with no rows only frees those that left."""
        cancelled = [s for s in self.running if s.cancelled]
        if cancelled:
            for seq in cancelled:
                self._retire(seq, "cancelled", now)
            self.recorder.left(self.running, now)
        finished = self._released()
        decoding = self.decoding
        prefill, wake_at = self._prefill_work(now, decoding)
        moves = {"finished": finished, "park": self._parking, "resume": self._resuming}
        self._parking, self._resuming = [], []
        budgets = [self._budget(s, bool(decoding)) for s in prefill]
        decoding = self.decoding  # with the rows resumed
        plan, rows = None, []
        if prefill and not (decoding and self.mixes and not any(s.alone for s in prefill)):
            self._decodes_since_prefill = 0
            rows = prefill
            plan = StepPlan.of(next(self._step_ids), rows, budgets, **moves)
        elif decoding:  # and the prompt tokens, where the engine runs them in the same forward
            self._decodes_since_prefill += 1
            rows = decoding + prefill
            scheduled = [s.num_uncomputed for s in decoding] + budgets
            guesses = self.guesses.plan(self.engine, decoding)
            plan = StepPlan.of(next(self._step_ids), rows, scheduled, **moves,
                               guesses=guesses and guesses + [0] * len(prefill))
        elif finished or moves["park"] or moves["resume"]:
            plan = StepPlan(0, **moves)  # nothing runs: the engine only lets go of them
        if plan is None:
            return None, wake_at
        self._held.update((s.id, s) for s in rows)
        return plan, None

    def rows(self, plan: StepPlan) -> list[Sequence]:
        """The sequences of ``plan``'s rows, in its order (planned, not yet released)."""
        return [self._held[i] for i in plan.ids]

    def _released(self) -> list[str]:
        """The rows the engine holds that left since the last plan: every one but the running
        rows it has begun and the parked (whose KV stays). Their speculation state goes too."""
        begun = sum(1 for s in self.running if s.num_computed)
        if len(self._held) == begun + len(self.parked):  # every row it holds is still live
            return []
        live = {s.id for s in self.running if s.num_computed} | {s.id for s in self.parked}
        gone = sorted(self._held.keys() - live)
        for row_id in gone:
            del self._held[row_id]
        self.guesses.forget(gone)
        return gone

    def _prefill_work(self, now: float, decoding: list[Sequence]) -> tuple[list[Sequence], float | None]:
        """The sequences whose prompt tokens this step computes: the next chunk of a long
        prompt begun earlier, or newcomers (none until the decoding rows had a step)."""
        if len(decoding) < len(self.running):  # a prompt is part-way through its prefill
            begun = next(s for s in self.running if s.prefilling)
            return ([begun] if not decoding or self._may_join() else []), None
        return self._admit(now)

    def _budget(self, seq: Sequence, streams: bool) -> int:
        """Prompt tokens to compute for ``seq`` this step: all that remain, or at most a chunk
        while ``streams`` decode. With none decoding a chunk protects nobody (newcomers wait
        for a prompt part-way either way) and costs a forward per chunk: the 900-token prompt
        of bench [h] took ~2x as long in 64-token chunks as whole. Alone, a prompt longer than
        the engine's ``prefill_step_tokens`` goes that many at a time: its memory stays bounded
        (an 8k-token prompt's activations were ~0.8 GB over the model's on the 1.5B shape)."""
        if streams and self._chunked(seq):
            return self.chunk_tokens
        step = self.prompt_step_tokens
        if seq.request.embed:  # pooled over its whole prompt, in one forward
            return seq.num_uncomputed
        return min(seq.num_uncomputed, step) if step else seq.num_uncomputed

    def _admit(self, now: float) -> tuple[list[Sequence], float | None]:
        cfg = self.config
        if not self.waiting:
            if self.parked and len(self.running) < self.max_batch_size:
                self._pick(self.max_batch_size - len(self.running), now)  # only parked rows: they resume
            return [], None
        if cfg.mode == "window" and self.running:
            return [], None  # the classic batcher runs a batch to completion
        if self.running:
            if not self._may_join():
                return [], None
        elif (deadline := self.queue.idle_wait(now)) is not None:
            return [], deadline  # a burst landing over some ms shares one prefill
        newcomers = self._pick(self.max_batch_size - len(self.running), now)
        if newcomers:
            self.queue.start(newcomers, now)
        return newcomers, None

    def _may_join(self) -> bool:
        """Whether newcomers may join running rows now: always where their prompts ride in
        the decoding rows' step; else after the running streams made progress since the last
        prefill."""
        return self.mixes or self._decodes_since_prefill >= DECODES_PER_PREFILL

    def _chunked(self, seq: Sequence) -> bool:
        # A request for its prompt's logprobs needs every prompt position's logits at once.
        # An embedding is pooled over its whole prompt at once.
        return (0 < self.chunk_tokens < len(seq.prompt_ids) and seq.params.prompt_logprobs is None
                and not seq.request.embed)

    def _pick(self, room: int, now: float) -> list[Sequence]:
        """The newcomers to prefill now, within ``room`` rows (an embedding takes none: it
        leaves in its step) and the prefill budget (a prompt to chunk goes alone); parked rows
        whose turn it is resume on the way, and with no room, a row of an owner holding more
        than its share is parked to make some.

        Without ``fair_share``: highest priority first, FIFO within a priority. With it, turn
        by turn, the owner that holds the fewest rows for its weight (``Owners.next``) gives
        its next: a parked row (they resume first), else its waiting request of the highest
        priority, FIFO within one."""
        if room == 0 and not self._may_park() and not any(s.request.embed for s in self.waiting):
            return []  # a full batch and nobody to make room for: no work on every step
        budget = self.prefill_budget
        if self.running and self.chunk_tokens:  # what the running rows wait for, at most
            budget = self.chunk_tokens if budget is None else min(budget, self.chunk_tokens)
        owners = self.queue.owners
        owners.reset(self.running, self.parked, self.waiting)
        newcomers: list[Sequence] = []
        tokens = 0  # the newcomers' prompt tokens so far
        while True:
            seq = owners.next()
            if seq is None:
                break
            victim = None
            # An embedding row holds no place in the batch: it leaves in the step that runs it.
            if room == 0 and not seq.request.embed:
                victim = owners.victim(seq, self.decoding) if self.can_park else None
                if victim is None:
                    break
            if seq.status is Status.WAITING:
                if newcomers and (seq.alone or newcomers[0].alone):
                    break
                if self._chunked(seq):
                    if newcomers:
                        break
                elif newcomers and budget is not None and tokens + seq.num_prompt_tokens > budget:
                    break  # over the step's prompt budget; the rest waits for the next step
            if victim is not None:
                self._park(victim, now)
            elif not seq.request.embed:
                room -= 1
            owners.take(seq)
            if seq.status is Status.PARKED:
                self._resume(seq, now)
                continue
            newcomers.append(seq)
            tokens += seq.num_prompt_tokens
            if self._chunked(seq):
                break
        return newcomers

    def _may_park(self) -> bool:
        """Whether a full batch might give a row up: parking is possible here and someone
        waits (or is parked) who is not the only owner running (a single-user server: never)."""
        if not self.can_park or not self.running:
            return False
        first = self.running[0].request.owner
        return any(s.request.owner != first for s in (*self.running, *self.waiting, *self.parked))

    def _park(self, seq: Sequence, now: float) -> None:
        """``seq`` sits out from the next step on; its KV and place in its answer stay."""
        self.running.remove(seq)
        self.parked.append(seq)
        seq.status = Status.PARKED
        seq.record.parked_at.append(now)
        self._parking.append(seq.id)
        self.recorder.parked(seq, self.running, now)

    def _resume(self, seq: Sequence, now: float) -> None:
        self.parked.remove(seq)
        self.running.append(seq)
        seq.status = Status.RUNNING
        seq.record.resumed_at.append(now)
        if seq.id in self._parking:  # parked and resumed before any step ran: nothing moves
            self._parking.remove(seq.id)
        else:
            self._resuming.append(seq.id)
        self.recorder.resumed(seq, self.running, now)

    # -- results ----------------------------------------------------------------------------
    def apply(self, plan: StepPlan, sampled: Sampled, now: float) -> list[tuple[Sequence, RowOutput]]:
        """Apply what a step computed: each row's computed tokens (a prompt chunk that is not
        its last yields no token; its ``num_computed`` moves on), prompt logprobs, guesses
        verified; a row whose grammar could not go on fails. Returns the live rows that got
        tokens, for the output stage to append (``loops/output_stage.py``), then
        ``close_step``."""
        out: list[tuple[Sequence, RowOutput]] = []
        for row, (seq, output) in enumerate(zip(self.rows(plan), sampled, strict=True)):
            if seq.status is not Status.RUNNING or seq.cancelled:
                continue
            if output.embedding is not None:  # an embedding: complete, and ended (close_step) with its vector
                seq.num_computed, seq.embedding, seq.finish_reason = len(seq.prompt_ids), output.embedding, "stop"
                self._embedded.append(seq)
                continue
            if plan.prompt[row]:
                # Complete: its first token came; else the engine says how far it got.
                seq.num_computed = len(seq.prompt_ids) if output.tokens else output.computed
                if output.prompt_logprobs is not None:
                    seq.prompt_logprobs = output.prompt_logprobs
            else:  # and the draft tokens its model agreed with: their KV is computed too
                seq.num_computed += plan.num_scheduled[row] + output.accepted
                self.guesses.verified(seq, output, self.engine.speculative_tokens)
            if output.error is not None:
                message = (f"The answer's constraint could not be followed to its end: {output.error}. "
                           "Simplify the schema or grammar.")
                seq.failure = ConstraintFailed(message, param=seq.params.constraint.param)
                self._retire(seq, "failed", now, error=message)
                self.recorder.left(self.running, now)
                continue
            if output.tokens:
                out.append((seq, output))
        return out

    def close_step(self, plan: StepPlan, sampled: Sampled, kept: list[tuple[Sequence, RowOutput, list[int]]],
                   started: float, now: float) -> None:
        """The step's record (tokens kept, of them forced by a grammar, drafts), and the rows
        the output stage finished retired."""
        forced = 0  # tokens kept that a grammar forced (a row may end inside its forced run)
        for seq, output, tokens in kept:
            if output.forced:
                n = min(output.forced, len(tokens) - 1)
                seq.record.forced_tokens += n
                forced += n
        drafts = (sum(o.proposed for o in sampled), sum(o.accepted for o in sampled))
        self.recorder.step(plan, self.rows(plan), sum(len(tokens) for _, _, tokens in kept), started, now,
                           forced=forced, drafts=drafts)
        done = [seq for seq, _, _ in kept if seq.finish_reason is not None] + self._embedded
        self._embedded = []
        for seq in done:
            self._retire(seq, "ok", now)
        if done:
            self.recorder.left(self.running, now)

    def fail(self, plan: StepPlan, error: str, now: float, *, retry: bool = True) -> None:
        """A step failed: only its requests fail, and the loop goes on.

        Failed newcomers are retried, each in a prefill of its own, when others shared their
        step (newcomers, or decoding rows in a mixed step), so one bad prompt cannot take
        down the requests admitted with it; alone, it fails. After a failed step with
        decoding rows every decoding row fails: its batch state is unknown (the rule both
        sides read, ``StepPlan.failure_loses_decoding``).
        """
        newcomers = [s for s, p in zip(self.rows(plan), plan.prompt, strict=True) if p]
        decoding = self.decoding if plan.failure_loses_decoding else []
        if newcomers and retry and (len(newcomers) > 1 or decoding):
            again = []
            for seq in newcomers:
                if seq.status is not Status.RUNNING:
                    continue
                self.running.remove(seq)
                if seq.cancelled:  # cancelled meanwhile: it ends here, it is not run again
                    self.queue.finish(seq, "cancelled", now)
                    continue
                seq.status, seq.alone, seq.num_computed = Status.WAITING, True, 0
                again.append(seq)
            self.waiting[:0] = again
            newcomers = []
        for seq in newcomers + decoding:
            if seq.status is Status.RUNNING:
                self._retire(seq, "failed", now, error=error)
        self.recorder.left(self.running, now)

    def _retire(self, seq: Sequence, outcome: str, now: float, error: str | None = None) -> None:
        self.queue.retire(seq, outcome, now, error)
