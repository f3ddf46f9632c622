"""Fair share between owners, in the scheduling core (fake clock, fake engine): who gets the
rows, who is parked for whom, and the per-owner limits."""

from __future__ import annotations

import pytest
from test_scheduler_core import core, ids, outputs, postprocess

from jupyter_infer.engine import StepPlan
from jupyter_infer.errors import QueueFull
from jupyter_infer.scheduler import Scheduler
from jupyter_infer.values.request import Request, SamplingParams
from jupyter_infer.values.sequence import Sequence, Status


def seq(owner: str, max_tokens: int = 50, priority: int = 0, weight: float = 1.0, at: float = 0.0) -> Sequence:
    request = Request("p", SamplingParams(max_tokens=max_tokens), priority=priority, owner=owner,
                      owner_weight=weight, arrival=at)
    return Sequence(request, [1, 2, 3, 4])


def step(s: Scheduler, now: float) -> StepPlan | None:
    plan, _ = s.schedule(now)
    if plan is not None:
        postprocess(s, plan, outputs([[7]] * len(plan.ids)), now, now)
    return plan


def held(s: Scheduler) -> dict[str, int]:
    counts: dict[str, int] = {}
    for q in s.running:
        counts[q.request.owner] = counts.get(q.request.owner, 0) + 1
    return counts


def burst(s: Scheduler, owner: str, n: int, **kw) -> list[Sequence]:
    seqs = [seq(owner, **kw) for _ in range(n)]
    for q in seqs:
        s.add(q, 0.0)
    return seqs


def test_a_newcomer_takes_the_place_of_a_burst_row_which_is_parked_then_resumes() -> None:
    s = core(max_batch_size=4, max_queue_size=100)
    burst(s, "alice", 20)
    step(s, 0.0)  # alice's first 4 prefill together
    step(s, 0.0)
    assert held(s) == {"alice": 4} and len(s.waiting) == 16
    bob = seq("bob", max_tokens=2)
    s.add(bob, 0.1)
    plan = step(s, 0.1)  # bob's prefill; alice's newest row sits out
    assert plan.kind == "prefill" and plan.ids == ids([bob])
    assert len(plan.park) == 1 and plan.resume == []
    parked = s.parked[0]
    assert parked.status is Status.PARKED and parked.request.owner == "alice"
    assert parked.id not in plan.finished  # its KV stays
    assert bob.record.first_token_at == 0.1
    outputs = len(parked.output_ids)
    decode = step(s, 0.2)  # bob's second token ends it
    assert decode.kind == "decode" and parked.id not in decode.ids and bob.id in decode.ids
    assert bob.status is Status.FINISHED and len(parked.output_ids) == outputs
    plan = step(s, 0.3)  # the freed row goes back to alice's parked row, not to her queue
    assert plan.resume == [parked.id] and parked.status is Status.RUNNING
    assert parked.id in plan.ids and len(parked.output_ids) == outputs + 1  # it goes on where it was
    assert parked.record.parked_at == [0.1] and parked.record.resumed_at == [0.3]  # the timeline draws it


def test_rows_are_shared_evenly_and_the_burst_keeps_them_all_while_alone() -> None:
    s = core(max_batch_size=16, max_queue_size=200)
    burst(s, "alice", 64)
    for t in range(4):
        step(s, t * 0.01)
    assert held(s) == {"alice": 16}  # alone, the burst has every row
    burst(s, "bob", 12)
    for t in range(4, 30):  # before the first rows' 50 tokens end
        step(s, t * 0.01)
    assert held(s) == {"alice": 8, "bob": 8}
    assert len(s.parked) == 8 and {q.request.owner for q in s.parked} == {"alice"}


def test_weights_share_the_rows_in_proportion() -> None:
    s = core(max_batch_size=16, max_queue_size=200)
    burst(s, "alice", 40)
    burst(s, "staff", 40, weight=3.0)
    for t in range(40):
        step(s, t * 0.01)
    assert held(s) == {"alice": 4, "staff": 12}


def test_priorities_order_an_owners_own_requests_not_its_place_among_owners() -> None:
    s = core(max_batch_size=2, max_queue_size=100)
    a_low = seq("alice", priority=0)
    a_high = seq("alice", priority=5)
    b = seq("bob", priority=0)
    for q in (a_low, a_high, b):
        s.add(q, 0.0)
    plan = step(s, 0.0)
    assert set(plan.ids) == {a_high.id, b.id}  # alice's urgent one, and bob's turn


def test_without_fair_share_a_newcomer_waits_behind_the_burst() -> None:
    s = core(max_batch_size=4, max_queue_size=100, fair_share=False)
    alice = burst(s, "alice", 20, max_tokens=10)
    bob = seq("bob", max_tokens=2)
    step(s, 0.0)
    s.add(bob, 0.1)
    for t in range(1, 200):
        plan = step(s, t * 0.01)
        assert not plan.park and not s.parked
        if bob.record.admitted_at is not None:
            break
    # FIFO: every request of alice's, queued before bob's, was admitted before it
    assert bob.record.admitted_at is not None and s.waiting == []
    assert all(q.record.admitted_at is not None and q.record.admitted_at <= bob.record.admitted_at for q in alice)


def test_owner_max_running_caps_the_rows_of_one_owner() -> None:
    s = core(max_batch_size=8, max_queue_size=100, owner_max_running=3)
    burst(s, "alice", 10)
    step(s, 0.0)
    step(s, 0.0)
    assert held(s) == {"alice": 3} and len(s.waiting) == 7


def test_owner_max_queued_refuses_that_owner_only_with_a_message_naming_the_limit() -> None:
    s = core(max_batch_size=2, max_queue_size=100, owner_max_queued=3)
    burst(s, "alice", 3)
    with pytest.raises(QueueFull) as refused:
        s.add(seq("alice"), 0.0)
    assert "owner_max_queued" in refused.value.message and refused.value.retry_after
    s.add(seq("bob"), 0.0)  # someone else is not held to alice's count
    assert len(s.waiting) == 4


def test_a_parked_row_cancelled_ends_at_once_and_its_kv_goes() -> None:
    s = core(max_batch_size=2, max_queue_size=100)
    burst(s, "alice", 4)
    step(s, 0.0)
    step(s, 0.0)
    s.add(seq("bob"), 0.1)
    step(s, 0.1)
    parked = s.parked[0]
    assert s.cancel(parked.id, 0.2)
    assert parked.status is Status.FINISHED and parked.record.outcome == "cancelled"
    plan = step(s, 0.3)
    assert parked.id in plan.finished and s.parked == []  # its KV goes


def test_parked_and_resumed_show_in_the_spans_and_the_counts() -> None:
    s = core(max_batch_size=2, max_queue_size=100)
    burst(s, "alice", 3, max_tokens=4)
    step(s, 0.0)
    step(s, 0.0)
    bob = seq("bob", max_tokens=1)
    s.add(bob, 0.1)
    step(s, 0.1)
    assert s.recorder.metrics.parked_rows == 1
    while s.running or s.waiting or s.parked:
        step(s, 0.5)
    owners = s.recorder.metrics.owners
    assert owners["alice"]["ok"] == 3 and owners["bob"]["ok"] == 1 and owners["alice"]["parked"] == 1
    spans = list(s.recorder.metrics.batches)
    assert any(bob.id in b.members for b in spans)
    assert all(len(b.owners) == len(b.members) for b in spans)
