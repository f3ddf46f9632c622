"""Whose turn it is: the rows of the batch shared between owners (fair share).

An owner is whoever sent a request (``Request.owner``: the Jupyter or hub user). Rows go to
owners by max-min fairness over weights (``Request.owner_weight``, from
``InferApp.fair_share_weights``): the next row goes to the owner holding the fewest rows for
its weight, ties to the one whose request came first; within an owner, its parked rows first
(they hold KV already), then its waiting requests by priority, FIFO within a priority. With
every row taken, an owner under its share takes one from the owner most over it, as long as
that leaves the other with at least as many (weighted): a burst of 64 keeps all the rows while
it is alone, and gives one up the moment someone else asks. ``owner_max_running`` caps the
rows one owner holds; the rest of its requests wait.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Iterable

from ..values.sequence import Sequence, Status


class Owners:
    """One admission's view of who holds what; ``reset`` it before each."""

    def __init__(self, fair: bool = True, max_running: int = 0) -> None:
        self.fair = fair  # False: one queue by priority then FIFO, whoever sent what
        self.max_running = max_running  # 0: no cap
        self.held: Counter[str] = Counter()
        self.weight: dict[str, float] = {}
        self._queues: dict[str, deque[Sequence]] = {}

    def reset(self, running: Iterable[Sequence], parked: Iterable[Sequence], waiting: Iterable[Sequence]) -> None:
        self.held = Counter(s.request.owner for s in running)
        queues: defaultdict[str, list[Sequence]] = defaultdict(list)
        for seq in parked:
            queues[seq.request.owner if self.fair else ""].append(seq)
        for seq in sorted(waiting, key=lambda s: s.priority_key):
            queues[seq.request.owner if self.fair else ""].append(seq)
        self._queues = {owner: deque(seqs) for owner, seqs in queues.items()}
        self.weight = {s.request.owner: s.request.owner_weight for q in self._queues.values() for s in q}
        for seq in running:
            self.weight.setdefault(seq.request.owner, seq.request.owner_weight)

    def _load(self, owner: str, extra: int = 0) -> float:
        return (self.held[owner] + extra) / self.weight.get(owner, 1.0)

    def next(self) -> Sequence | None:
        """The next row to give (not taken yet): the head of the most deserving owner's
        queue, passing over owners at ``max_running``."""
        heads = [head for q in self._queues.values()
                 if (head := next((s for s in q if not self._capped(s.request.owner)), None)) is not None]
        if not heads:
            return None
        return min(heads, key=lambda s: (self._load(s.request.owner), s.request.order))

    def _capped(self, owner: str) -> bool:
        return bool(self.max_running) and self.held[owner] >= self.max_running

    def take(self, seq: Sequence) -> None:
        """``seq`` got its row."""
        owner = seq.request.owner
        self._queues[owner if self.fair else ""].remove(seq)
        self.held[owner] += 1

    def victim(self, seq: Sequence, decoding: list[Sequence]) -> Sequence | None:
        """The row to park so that ``seq`` can have one when none is free: the newest decoding
        row of the owner holding the most for its weight, if giving it up still leaves that
        owner at least what ``seq``'s owner would then hold; else None (``seq`` waits)."""
        owner = seq.request.owner
        movable = [s for s in decoding if s.request.owner != owner and s.status is Status.RUNNING]
        if not movable:
            return None
        richest = max({s.request.owner for s in movable}, key=self._load)
        if self._load(richest, -1) < self._load(owner, +1):
            return None
        newest = next(s for s in reversed(movable) if s.request.owner == richest)
        self.held[richest] -= 1
        return newest
