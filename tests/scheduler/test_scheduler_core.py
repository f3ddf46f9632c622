"""The scheduling core alone: policy decisions with a fake clock and a fake engine, no
asyncio, no sleeps, no timing bounds."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import pytest

from jupyter_infer.engine import RowOutput, Sampled, StepPlan
from jupyter_infer.errors import QueueFull
from jupyter_infer.loops.answer_stage import AnswerStage
from jupyter_infer.loops.engine_loop import take_step
from jupyter_infer.scheduler import Recorder, Scheduler
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.events import EventBus
from jupyter_infer.values.metrics import MetricsCollector
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Sequence, Status

EOS = 0


def outputs(tokens: list[list[int]], computed: list[int | None] | None = None) -> Sampled:
    """A step's output: these tokens for each row (and where a prompt row got to)."""
    return [RowOutput(list(t), computed=c) for t, c in zip(tokens, computed or [None] * len(tokens), strict=True)]


class FakeEngine:
    """What the core reads of an engine: detokenize, the EOS ids and its speculation settings.
    Token ``n`` is "wn "."""

    eos_token_ids = frozenset({EOS})
    speculative_method, speculative_tokens, speculative_max_rows = "off", 0, 0

    @staticmethod
    def detokenize(ids: Seq[int]) -> str:
        return "".join(f"w{i} " for i in ids)


def postprocess(s: Scheduler, plan: StepPlan, sampled: Sampled, started: float, now: float):
    """A step's outputs as the engine loop takes them: the core applies them, the answer stage
    appends the tokens (and ends rows), the core closes the step."""
    return [(seq, kept, event.text if event is not None else "")
            for seq, kept, event in take_step(s, AnswerStage(s.engine), plan, sampled, started, now)]


def core(**config) -> Scheduler:
    config.setdefault("idle_admit_delay_ms", 0.0)
    cfg = ServiceConfig(**config)
    return Scheduler(cfg, FakeEngine(), Recorder(cfg.mode, MetricsCollector(), EventBus()))


def seq(n_prompt: int = 4, max_tokens: int = 3, priority: int = 0, at: float = 0.0) -> Sequence:
    request = Request("p", SamplingParams(max_tokens=max_tokens), priority=priority, arrival=at)
    return Sequence(request, list(range(1, n_prompt + 1)))


def ids(seqs: Seq[Sequence]) -> list[str]:
    return [x.id for x in seqs]


def run_step(s: Scheduler, now: float, token: int = 7) -> StepPlan | None:
    """Schedule at ``now`` and, if there is a plan, give every row ``token``."""
    plan, _ = s.schedule(now)
    if plan is not None:
        postprocess(s, plan, outputs([[token]] * len(plan.ids)), now, now)
    return plan


def test_window_waits_for_its_window_then_groups_and_the_17th_waits() -> None:
    s = core(mode="window", batch_window_ms=50, max_batch_size=16)
    seqs = [seq(at=0.0) for _ in range(17)]
    for x in seqs[:3]:
        s.add(x, 0.0)
    plan, wake_at = s.schedule(0.01)
    assert plan is None and wake_at == pytest.approx(0.05)  # the window is still open
    for x in seqs[3:]:
        s.add(x, 0.02)
    plan, _ = s.schedule(0.02)  # full batch: no need to wait for the window
    assert plan.kind == "prefill" and plan.ids == ids(seqs[:16])
    assert [x.status for x in seqs[:16]] == [Status.RUNNING] * 16 and seqs[16].status is Status.WAITING
    postprocess(s, plan, outputs([[7]] * 16), 0.02, 0.03)
    # Window mode runs the batch to completion: the 17th is not admitted meanwhile.
    assert s.schedule(0.2)[0].kind == "decode"


def test_window_expiry_admits_a_partial_batch() -> None:
    s = core(mode="window", batch_window_ms=50)
    for _ in range(3):
        s.add(seq(), 0.0)
    assert s.schedule(0.049)[0] is None
    plan, _ = s.schedule(0.05)
    assert plan.kind == "prefill" and len(plan.ids) == 3


def test_continuous_newcomer_joins_after_one_decode_step_and_leavers_go_at_once() -> None:
    s = core(mode="continuous")
    a = seq(max_tokens=10)
    s.add(a, 0.0)
    assert run_step(s, 0.0).kind == "prefill"
    b = seq(max_tokens=1)
    s.add(b, 0.01)
    # The running row gets a decode step before the next prefill (it cannot starve) ...
    assert run_step(s, 0.01).kind == "decode"
    plan = run_step(s, 0.02)
    # ... then the newcomer joins the running batch; nobody left before it.
    assert plan.kind == "prefill" and plan.ids == ids([b]) and plan.finished == []
    assert b.status is Status.FINISHED and b.record.finish_reason == "length"
    plan = run_step(s, 0.03)
    assert plan.kind == "decode" and plan.ids == ids([a]) and plan.finished == [b.id]  # b's row goes


def test_priority_first_then_fifo() -> None:
    s = core(mode="window", batch_window_ms=0, max_batch_size=2)
    low = [seq(priority=0) for _ in range(2)]
    high = seq(priority=5)
    for x in (*low, high):
        s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    assert plan.ids == ids([high, low[0]])


def test_prefill_budget_splits_long_prompts() -> None:
    s = core(mode="continuous", max_prefill_tokens=10)
    a, b = seq(n_prompt=6), seq(n_prompt=6)
    s.add(a, 0.0)
    s.add(b, 0.0)
    assert s.schedule(0.0)[0].ids == ids([a])  # 2 x 6 padded tokens would exceed 10


def test_queue_full_refuses_without_queueing() -> None:
    s = core(max_queue_size=2)
    s.add(seq(), 0.0)
    s.add(seq(), 0.0)
    with pytest.raises(QueueFull, match="queue is full"):
        s.add(seq(), 0.0)
    assert len(s.waiting) == 2 and s.recorder.metrics.outcomes["rejected"] == 1


def test_cancel_queued_ends_now_and_running_at_the_next_step() -> None:
    s = core(mode="continuous", max_batch_size=1)
    running, queued = seq(max_tokens=10), seq(max_tokens=10)
    s.add(running, 0.0)
    run_step(s, 0.0)
    s.add(queued, 0.0)
    assert s.cancel(queued.id, 0.01)
    assert [x.id for x in s.queue.pop_finished()] == [queued.id] and queued.record.outcome == "cancelled"
    assert s.cancel(running.id, 0.01) and running.status is Status.RUNNING
    # The cancelled row left before anything else ran: the only plan lets go of its KV.
    plan = s.schedule(0.02)[0]
    assert plan.kind == "release" and plan.ids == [] and plan.finished == [running.id]
    assert running.record.outcome == "cancelled" and not s.running
    assert s.schedule(0.02)[0] is None  # nothing left to run, nor to free
    assert not s.cancel("req-unknown", 0.03)


def test_eos_and_stop_strings_finish_rows() -> None:
    s = core()
    a = seq(max_tokens=10)
    a.params = SamplingParams(max_tokens=10, stop=("w9",))
    b = seq(max_tokens=10)
    s.add(a, 0.0)
    s.add(b, 0.0)
    plan, _ = s.schedule(0.0)
    released = postprocess(s, plan, outputs([[9], [EOS]]), 0.0, 0.0)
    assert [text for _, _, text in released] == ["", ""]
    assert a.record.finish_reason == "stop" and a.text == ""
    assert b.record.finish_reason == "stop" and b.output_ids == []


def test_a_failed_group_prefill_retries_each_newcomer_alone() -> None:
    s = core(mode="continuous")
    rows = [seq() for _ in range(3)]
    for x in rows:
        s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    s.fail(plan, "boom", 0.01)
    assert not s.queue.pop_finished() and all(x.status is Status.WAITING and x.alone for x in rows)
    assert s.schedule(0.02)[0].ids == ids([rows[0]])  # each alone now, in their order


def test_a_request_cancelled_during_a_failed_group_prefill_is_not_run_again() -> None:
    s = core(mode="continuous")
    rows = [seq() for _ in range(3)]
    for x in rows:
        s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    s.cancel(rows[1].id, 0.005)  # the caller leaves while the prefill runs
    s.fail(plan, "boom", 0.01)
    assert [x.id for x in s.queue.pop_finished()] == [rows[1].id]
    assert rows[1].record.outcome == "cancelled" and rows[1] not in s.waiting
    assert [x.id for x in s.waiting] == [rows[0].id, rows[2].id]


def test_a_failed_decode_fails_every_running_row_and_only_those() -> None:
    s = core(mode="continuous", max_batch_size=2)
    a, b, c = seq(max_tokens=10), seq(max_tokens=10), seq(max_tokens=10)
    for x in (a, b):
        s.add(x, 0.0)
    run_step(s, 0.0)
    s.add(c, 0.0)
    plan, _ = s.schedule(0.01)
    assert plan.kind == "decode"
    s.fail(plan, "boom", 0.02)
    assert {x.id for x in s.queue.pop_finished()} == {a.id, b.id}
    assert a.record.error == "boom" and c.status is Status.WAITING


def test_prompt_tokens_count_only_once_prefilled() -> None:
    s = core(mode="continuous", max_batch_size=1)
    served, cancelled = seq(n_prompt=5, max_tokens=1), seq(n_prompt=7)
    s.add(served, 0.0)
    s.add(cancelled, 0.0)
    s.cancel(cancelled.id, 0.0)
    run_step(s, 0.0)
    failed = seq(n_prompt=11)
    s.add(failed, 0.1)
    plan, _ = s.schedule(0.1)
    s.fail(plan, "boom", 0.1)
    metrics = s.recorder.metrics
    assert metrics.prompt_tokens == 5
    assert metrics.outcomes == {"ok": 1, "cancelled": 1, "failed": 1}


def test_continuous_spans_follow_membership() -> None:
    s = core(mode="continuous")
    rows = [seq(max_tokens=n) for n in (1, 2, 2)]
    for x in rows:
        s.add(x, 0.0)
    t = 0.0
    while run_step(s, t) is not None:
        t += 0.01
    batches = list(s.recorder.metrics.batches)
    assert [len(b.members) for b in batches] == [3, 2]  # one span per membership
    assert rows[1].record.batch_ids == [b.id for b in batches]
    assert sum(b.tokens for b in batches) == 5


def test_idle_continuous_engine_waits_for_a_burst_to_pause() -> None:
    s = core(mode="continuous", idle_admit_delay_ms=10)
    s.add(seq(), 0.0)
    plan, wake_at = s.schedule(0.001)
    assert plan is None and wake_at == pytest.approx(0.010)
    s.add(seq(), 0.008)
    plan, wake_at = s.schedule(0.009)
    assert plan is None and wake_at == pytest.approx(0.018)
    assert len(s.schedule(0.0181)[0].ids) == 2


# -- chunked prefill -----------------------------------------------------------------------
class ChunkingEngine(FakeEngine):
    prefill_chunk_tokens = 64


def chunking_core(**config) -> Scheduler:
    config.setdefault("idle_admit_delay_ms", 0.0)
    cfg = ServiceConfig(**config)
    return Scheduler(cfg, ChunkingEngine(), Recorder(cfg.mode, MetricsCollector(), EventBus()))


def chunk_step(s: Scheduler, now: float, last: bool) -> StepPlan:
    """Schedule a chunk at ``now``; the engine says whether it was the prompt's last (if
    not, how far the prompt's computed tokens got)."""
    plan, _ = s.schedule(now)
    assert plan is not None and plan.chunk, plan
    [x], [n] = s.rows(plan), plan.num_scheduled
    postprocess(s, plan, outputs([[7]]) if last else outputs([[]], computed=[x.num_computed + n]), now, now)
    return plan


def test_a_long_prompt_is_prefilled_in_chunks_between_decode_steps() -> None:
    s = chunking_core(prefill_chunk_tokens=4)
    a = seq(n_prompt=3, max_tokens=10)
    s.add(a, 0.0)
    assert run_step(s, 0.0).kind == "prefill"
    b = seq(n_prompt=10, max_tokens=2)
    s.add(b, 0.01)
    kinds = []
    for i, last in enumerate((False, False, True)):
        assert run_step(s, 0.02 + i / 100).kind == "decode"  # the running row first, each time
        plan = chunk_step(s, 0.025 + i / 100, last)
        # The running row stays, and so does b's row from its second chunk on.
        assert plan.ids == ids([b]) and plan.finished == [] and plan.chunk == 4
        kinds.append(b.prefilling)
    # Prefilling until the last chunk; no token (no first-token time) before it.
    assert kinds == [True, True, False] and b.num_computed == 10
    assert b.output_ids == [7] and b.record.first_token_at == pytest.approx(0.045)
    plan = run_step(s, 0.05)
    assert plan.kind == "decode" and plan.ids == ids([a, b])


def test_a_prompt_alone_goes_at_most_the_engines_prompt_step_at_a_time() -> None:
    """Nothing decodes, but the prompt is longer than the engine's prefill_step_tokens: that
    many tokens a step (its activations bounded), the first token after the last step."""
    s = chunking_core(prefill_chunk_tokens=4)
    s.prompt_step_tokens = 8
    b = seq(n_prompt=20, max_tokens=2)
    s.add(b, 0.0)
    steps = []
    for i, last in enumerate((False, False, True)):
        plan, _ = s.schedule(i / 100)
        assert plan is not None and plan.ids == ids([b])
        steps.append(plan.num_scheduled[0])
        n = plan.num_scheduled[0]
        postprocess(s, plan, outputs([[7]]) if last else outputs([[]], computed=[b.num_computed + n]), i / 100, i / 100)
    assert steps == [8, 8, 4] and b.num_computed == 20 and b.output_ids == [7]


def test_an_idle_engine_prefills_a_long_prompt_whole_and_the_rest_of_one_whose_streams_ended() -> None:
    s = chunking_core(prefill_chunk_tokens=4)
    b = seq(n_prompt=9)
    s.add(b, 0.0)
    plan = run_step(s, 0.0)  # nothing decodes: no stream for a chunk to protect
    assert plan.num_scheduled == [9] and not plan.chunk and s.running == [b] and not b.prefilling
    s = chunking_core(prefill_chunk_tokens=4)
    a, c = seq(n_prompt=3, max_tokens=3), seq(n_prompt=10)
    s.add(a, 0.0)
    run_step(s, 0.0)
    s.add(c, 0.01)
    assert run_step(s, 0.01).kind == "decode"
    chunk_step(s, 0.02, last=False)  # admitted while a decodes: chunked
    assert run_step(s, 0.03).kind == "decode"  # a's last token: it finishes
    assert [x.id for x in s.queue.pop_finished()] == [a.id]
    plan, _ = s.schedule(0.04)
    assert plan.ids == ids([c]) and plan.num_scheduled == [6]  # the rest, at once


def test_while_a_prompt_is_chunked_others_wait_and_running_rows_bound_group_prefills() -> None:
    s = chunking_core(prefill_chunk_tokens=8, max_batch_size=8)
    first = seq(n_prompt=3, max_tokens=50)
    s.add(first, 0.0)
    run_step(s, 0.0)
    long_, shorts = seq(n_prompt=20), [seq(n_prompt=3) for _ in range(5)]
    s.add(long_, 0.0)
    for x in shorts:
        s.add(x, 0.0)
    # The long prompt came first: it goes alone, and the short ones wait for its last chunk.
    assert run_step(s, 0.001).kind == "decode"
    assert chunk_step(s, 0.002, last=False).ids == ids([long_])
    assert run_step(s, 0.003).kind == "decode"
    assert chunk_step(s, 0.01, last=False).ids == ids([long_])
    assert run_step(s, 0.011).kind == "decode"
    chunk_step(s, 0.02, last=True)
    assert run_step(s, 0.03).kind == "decode"
    # With rows running, a group prefill holds at most a chunk of prompt tokens: 3 + 3 <= 8.
    plan = run_step(s, 0.04)
    assert plan.kind == "prefill" and plan.ids == ids(shorts[:2]) and not plan.chunk


def test_an_idle_engine_groups_short_prompts_up_to_the_prefill_budget() -> None:
    s = chunking_core(prefill_chunk_tokens=8)
    shorts = [seq(n_prompt=3) for _ in range(5)]
    for x in shorts:
        s.add(x, 0.0)
    assert run_step(s, 0.0).ids == ids(shorts)  # nothing runs: nobody to stall


def test_a_short_prompt_ahead_of_a_long_one_goes_first_and_alone() -> None:
    s = chunking_core(prefill_chunk_tokens=4)
    short, long_ = seq(n_prompt=3), seq(n_prompt=9)
    s.add(short, 0.0)
    s.add(long_, 0.0)
    assert run_step(s, 0.0).ids == ids([short])
    assert s.running == [short] and long_.status is Status.WAITING


def test_a_prompt_cancelled_while_prefilling_ends_at_the_next_step() -> None:
    s = chunking_core(prefill_chunk_tokens=4)
    a, b = seq(n_prompt=3, max_tokens=10), seq(n_prompt=10)
    s.add(a, 0.0)
    run_step(s, 0.0)
    s.add(b, 0.0)
    run_step(s, 0.01)
    chunk_step(s, 0.02, last=False)
    assert s.cancel(b.id, 0.025) and b.prefilling
    plan, _ = s.schedule(0.03)
    assert plan.kind == "decode" and plan.ids == ids([a])
    assert s.running == [a] and b.record.outcome == "cancelled"
    assert [x.id for x in s.queue.pop_finished()] == [b.id]


def test_a_failed_chunk_fails_only_its_request() -> None:
    s = chunking_core(prefill_chunk_tokens=4)
    a, b = seq(n_prompt=3, max_tokens=10), seq(n_prompt=10)
    s.add(a, 0.0)
    run_step(s, 0.0)
    s.add(b, 0.0)
    run_step(s, 0.01)
    plan, _ = s.schedule(0.02)
    s.fail(plan, "boom", 0.03)
    assert b.record.outcome == "failed" and b.record.error == "boom" and b not in s.running
    assert s.running == [a] and run_step(s, 0.04).kind == "decode"


def test_the_chunk_size_is_the_engines_own_unless_configured() -> None:
    assert chunking_core().chunk_tokens == ChunkingEngine.prefill_chunk_tokens
    assert chunking_core(prefill_chunk_tokens=16).chunk_tokens == 16


@pytest.mark.parametrize("why", ["window mode", "engine cannot", "off"])
def test_no_chunks_in_window_mode_for_engines_that_cannot_or_when_off(why: str) -> None:
    if why == "window mode":
        s = chunking_core(mode="window", batch_window_ms=0, prefill_chunk_tokens=4)
    elif why == "engine cannot":
        s = core(prefill_chunk_tokens=4)
    else:
        s = chunking_core(prefill_chunk_tokens=0)
    long_ = seq(n_prompt=10)
    s.add(long_, 0.0)
    plan = run_step(s, 0.0)
    assert plan.kind == "prefill" and not plan.chunk and long_.status is Status.RUNNING


def test_a_cr_at_the_end_of_a_fragment_waits_for_the_next_one() -> None:
    class CRLF(FakeEngine):
        @staticmethod
        def detokenize(ids: Seq[int]) -> str:
            return "".join({1: "a\r", 2: "\nb"}[i] for i in ids)

    s = core()
    s.engine = CRLF()
    x = seq(max_tokens=5)
    s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    first = postprocess(s, plan, outputs([[1]]), 0.0, 0.0)[0][2]
    second = postprocess(s, s.schedule(0.0)[0], outputs([[2]]), 0.0, 0.0)[0][2]
    # "a\r" + "\nb" as fragments "a" and "\r\nb": an SSE reader sees one line break, not two.
    assert (first, second) == ("a", "\r\nb")


class ByteEngine(FakeEngine):
    """Token ``n`` is the byte ``n``: a character of several bytes spans several tokens."""

    @staticmethod
    def detokenize(ids: Seq[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("end", ["max_tokens", "eos"])
def test_an_answer_cut_inside_a_character_keeps_its_last_bytes(end: str) -> None:
    """The end of an answer whose last tokens do not form complete UTF-8 is released as the
    tokenizer decodes it (U+FFFD), not lost: held back while it might complete, it must go
    once the answer ends."""
    s = core()
    s.engine = ByteEngine()
    x = Sequence(Request("p", SamplingParams(max_tokens=3)), [1, 2])
    s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    e_acute = list("é".encode())  # two bytes, two tokens
    tokens = [ord("a"), e_acute[0]] + ([e_acute[0]] if end == "max_tokens" else [EOS])
    released = [postprocess(s, plan, outputs([[t]]), 0.0, 0.0)[0][2] for t in tokens[:1]]
    for token in tokens[1:]:
        released += [text for _, _, text in postprocess(s, s.schedule(0.0)[0], outputs([[token]]), 0.0, 0.0)]
    assert x.finish_reason == ("length" if end == "max_tokens" else "stop")
    assert "".join(released) == x.text == x.result().text
    assert x.text == ("a\ufffd\ufffd" if end == "max_tokens" else "a\ufffd")


def test_a_step_of_several_tokens_per_row_finishes_a_row_in_the_middle_of_them() -> None:
    """A multi-token step (drafts verified, a grammar's forced tokens): each token is
    appended and checked in turn; a stop string or max_tokens reached part-way ends the row
    there, and the tokens after it are not kept."""
    s = core()
    a, b = seq(max_tokens=10), seq(max_tokens=3)
    a.params = SamplingParams(max_tokens=10, stop=("w5",))
    for x in (a, b):
        s.add(x, 0.0)
    plan, _ = s.schedule(0.0)
    postprocess(s, plan, outputs([[4], [4]]), 0.0, 0.0)
    plan, _ = s.schedule(0.0)
    released = postprocess(s, plan, outputs([[6, 5, 8], [6, 7, 8, 9]]), 0.0, 0.0)
    assert [(kept, text) for _, kept, text in released] == [([6, 5], "w6 "), ([6, 7], "w6 w7 ")]
    assert a.output_ids == [4, 6, 5] and a.finish_reason == "stop" and a.text == "w4 w6 "
    assert b.output_ids == [4, 6, 7] and b.finish_reason == "length"
    assert s.running == [] and a.num_computed == b.num_computed == 4 + 1


# -- mixed steps: newcomers' prompts ride in the decoding rows' step ----------------------------
class MixingEngine(ChunkingEngine):
    mixes_steps = True


def mixing_core(**config) -> Scheduler:
    config.setdefault("idle_admit_delay_ms", 0.0)
    cfg = ServiceConfig(**config)
    return Scheduler(cfg, MixingEngine(), Recorder(cfg.mode, MetricsCollector(), EventBus()))


def mixed_step(s: Scheduler, now: float) -> StepPlan:
    """Schedule at ``now``: a decoding row gets a token; a prompt row gets its first when its
    budget reaches its prompt's end, else its computed tokens move on."""
    plan, _ = s.schedule(now)
    assert plan is not None
    done = [p and x.num_computed + n >= len(x.prompt_ids)
            for x, n, p in zip(s.rows(plan), plan.num_scheduled, plan.prompt, strict=True)]
    tokens = [[7] if not p or d else [] for p, d in zip(plan.prompt, done, strict=True)]
    computed = [x.num_computed + n if p else None
                for x, n, p in zip(s.rows(plan), plan.num_scheduled, plan.prompt, strict=True)]
    postprocess(s, plan, outputs(tokens, computed=computed), now, now)
    return plan


def test_a_newcomer_rides_in_the_decoding_rows_next_step_and_gets_its_first_token_there() -> None:
    s = mixing_core(mode="continuous")
    a = seq(max_tokens=10)
    s.add(a, 0.0)
    assert mixed_step(s, 0.0).kind == "prefill"  # nothing decodes yet: a prefill of its own
    b, c = seq(n_prompt=5, max_tokens=3), seq(n_prompt=6, max_tokens=3)
    s.add(b, 0.01)
    s.add(c, 0.01)
    plan = mixed_step(s, 0.01)
    # One step: a's next token and both newcomers' prompts, whole; nobody waits for a step of its own.
    assert plan.kind == "mixed" and plan.ids == ids([a, b, c]) and plan.prompt == [False, True, True]
    assert plan.num_scheduled == [1, 5, 6] and plan.finished == [] and not plan.chunk
    assert a.output_ids == [7, 7] and b.output_ids == [7] == c.output_ids
    assert b.record.first_token_at == pytest.approx(0.01)
    plan = mixed_step(s, 0.02)
    assert plan.kind == "decode" and plan.ids == ids([a, b, c])


def test_a_long_prompt_is_chunked_through_mixed_steps_and_the_decoding_rows_never_skip_one() -> None:
    s = mixing_core(prefill_chunk_tokens=4)
    a = seq(n_prompt=3, max_tokens=10)
    s.add(a, 0.0)
    mixed_step(s, 0.0)
    b = seq(n_prompt=10, max_tokens=2)
    s.add(b, 0.01)
    plans = [mixed_step(s, 0.01 + i / 100) for i in range(3)]
    # A chunk a step beside a's token: a gets a token every step, b's prompt goes 4, 4, 2.
    assert [p.kind for p in plans] == ["mixed"] * 3 and all(p.ids == ids([a, b]) for p in plans)
    assert [p.num_scheduled for p in plans] == [[1, 4], [1, 4], [1, 4]] and all(p.chunk == 4 for p in plans)
    assert a.output_ids == [7] * 4 and b.output_ids == [7] and b.num_computed == 10
    assert b.record.first_token_at == pytest.approx(0.03)


def test_a_failed_mixed_step_fails_the_decoding_rows_and_retries_the_newcomer_alone() -> None:
    s = mixing_core(mode="continuous")
    a, b = seq(max_tokens=10), seq(max_tokens=3)
    s.add(a, 0.0)
    mixed_step(s, 0.0)
    s.add(b, 0.01)
    plan, _ = s.schedule(0.01)
    assert plan.kind == "mixed"
    s.fail(plan, "boom", 0.02)
    # The decoding row's batch state is unknown after the failed forward; the newcomer may
    # be innocent: it is retried in a prefill of its own.
    assert a.record.outcome == "failed" and b.status is Status.WAITING and b.alone
    plan = mixed_step(s, 0.03)
    assert plan.kind == "prefill" and plan.ids == ids([b])


def test_the_window_batcher_never_mixes() -> None:
    s = mixing_core(mode="window", batch_window_ms=0)
    a = seq(max_tokens=5)
    s.add(a, 0.0)
    mixed_step(s, 0.0)
    s.add(seq(), 0.01)
    assert mixed_step(s, 0.01).kind == "decode"


def test_a_steps_prompt_budget_counts_real_tokens_not_padding() -> None:
    """The ragged forward leaves padding out: a 2-token and a 6-token prompt cost 8, not 12."""
    s = mixing_core(prefill_chunk_tokens=8)
    a = seq(n_prompt=3, max_tokens=10)
    s.add(a, 0.0)
    mixed_step(s, 0.0)
    short, other, third = seq(n_prompt=2), seq(n_prompt=6), seq(n_prompt=2)
    for x in (short, other, third):
        s.add(x, 0.01)
    plan = mixed_step(s, 0.01)
    assert plan.ids == ids([a, short, other]) and plan.num_scheduled == [1, 2, 6]
    assert mixed_step(s, 0.02).ids == ids([a, short, other, third])


class GuessingEngine(FakeEngine):
    speculative_method, speculative_tokens, speculative_max_rows = "ngram", 16, 2


def guessing_core() -> Scheduler:
    cfg = ServiceConfig(idle_admit_delay_ms=0.0, mode="continuous")
    return Scheduler(cfg, GuessingEngine(), Recorder(cfg.mode, MetricsCollector(), EventBus()))


def test_the_scheduler_decides_who_guesses_and_how_many() -> None:
    s = guessing_core()
    rows = [seq(max_tokens=40) for _ in range(3)]
    for x in rows:
        s.add(x, 0.0)
    run_step(s, 0.0)  # their prompts
    plan, _ = s.schedule(0.01)
    assert plan.guesses == []  # 3 decoding rows > speculative_max_rows (2): nobody guesses
    postprocess(s, plan, outputs([[7], [7], [EOS]]), 0.01, 0.01)
    plan, _ = s.schedule(0.02)
    # Two rows share the step's 32 draft tokens: 16 each (the engine's most), room permitting.
    assert plan.guesses == [16, 16]
    # The first kept none of its 16 guesses, the second all of them.
    postprocess(s, plan, [RowOutput([7], proposed=16, accepted=0), RowOutput([7] * 17, proposed=16, accepted=16)],
                  0.02, 0.02)
    assert [x.num_computed - x.num_prompt_tokens for x in rows[:2]] == [2, 18]  # the accepted ones count
    plan, _ = s.schedule(0.03)
    assert plan.guesses == [1, 16]  # one after a miss of several; the other's room: 40 - 19 - 1 = 20, most 16
    postprocess(s, plan, [RowOutput([7], proposed=1, accepted=0), RowOutput([7])], 0.03, 0.03)
    # Its one guess was wrong: it sits out (prompt lookup on paper finds nothing in "1 2 3 4 7 7 7").
    waits = []
    for step in range(10):
        plan, _ = s.schedule(0.04 + step)
        waits.append(plan.guesses[0] if plan.guesses else 0)
        postprocess(s, plan, outputs([[8 + step]] * 2), 0.04 + step, 0.04 + step)
    assert waits[:8] == [0] * 8 and waits[8] == 1  # 8 steps out, then one guess again


def test_rows_that_ask_for_logprobs_or_carry_a_seed_never_guess() -> None:
    s = guessing_core()
    asks = Sequence(Request("p", SamplingParams(max_tokens=40, logprobs=1)), [1, 2, 3])
    seeded = Sequence(Request("p", SamplingParams(max_tokens=40, temperature=0.7, seed=3)), [1, 2, 3])
    s.add(asks, 0.0)
    s.add(seeded, 0.0)
    run_step(s, 0.0)
    plan, _ = s.schedule(0.01)
    assert plan.ids == [asks.id, seeded.id] and plan.guesses == []


def test_embeddings_take_no_place_in_a_full_batch_and_end_in_their_step() -> None:
    """An embedding row leaves in the step that runs it: a batch full of decoding rows still
    takes every embedding waiting (within the prefill budget), whole, and they end there with
    their vectors, the decoding rows going on."""
    s = core(mode="continuous", max_batch_size=2)
    streams = [seq(max_tokens=10), seq(max_tokens=10)]
    for x in streams:
        s.add(x, 0.0)
    assert run_step(s, 0.0).kind == "prefill"
    embeds = []
    for i in range(6):
        request = Request("text", SamplingParams(max_tokens=0), embed=True, arrival=0.01 + i / 1000)
        embeds.append(Sequence(request, list(range(1, 30))))
        s.add(embeds[-1], 0.01)
    assert run_step(s, 0.02).kind == "decode"  # the running rows' decode step first, then room for prompts
    plan, _ = s.schedule(0.03)
    assert plan.kind == "prefill"  # this engine does not mix: the prompts' step of their own
    newcomers = [i for i, p in zip(plan.ids, plan.prompt, strict=True) if p]
    assert newcomers == ids(embeds) and plan.chunk == 0  # all six, whole, past max_batch_size
    sampled = [RowOutput(embedding=[1.0]) if p else RowOutput([7]) for p in plan.prompt]
    postprocess(s, plan, sampled, 0.03, 0.03)
    assert all(e.status is Status.FINISHED and e.embedding == [1.0] and e.record.finish_reason == "stop"
               for e in embeds)
    assert all(x.status is Status.RUNNING for x in streams) and len(s.running) == 2
