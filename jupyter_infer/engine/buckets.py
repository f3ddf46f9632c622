"""Length buckets: the decoding rows as a few dense batches of similar lengths.

One dense left-padded batch makes every row as long as the longest: a 900-token prompt among
~20-token ones has every short row hold, and read at every step, ~900 columns of padding. Here
the decoding rows are one or more ``HFBatch`` buckets, each dense (TGI's layout) and decoded by
its own forward. The rule is a cost: a decode step of a bucket reads every weight once and
the keys and values of its rows (rows × width × bytes per token), and both are memory reads
on a CPU (and mostly on a GPU). When rows join or leave, the rows sorted by length are cut
into the runs whose steps read least (a small dynamic program), and the buckets are regrouped
so when what that saves per step repays the copy soon: a long prompt among short ones gets a
bucket of its own once the padding it makes the others carry costs more than a second read of
the weights, and buckets merge again when the rows that kept them apart leave. Rows grow by a
column a step together, so the padding between two buckets stays what it was: the decision
changes only when rows join or leave.

Equal prompts (a burst) stay one bucket: the same forward as a single dense batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .hf_batch import HFBatch

# A regrouping copies the KV of the rows it moves: worth it when the reads it saves per step
# repay that copy within this many steps.
REPAY_STEPS = 16


@dataclass
class Buckets:
    """The decoding rows, bucket after bucket; ``ids`` in that order (not the order they
    joined: ``decode`` answers in the plan's order)."""

    buckets: list[HFBatch]
    weight_bytes: int  # what one forward reads of the weights
    kv_bytes_per_token: int  # one token's keys and values over every layer

    @property
    def ids(self) -> list[str]:
        return [i for b in self.buckets for i in b.ids]

    def __iter__(self) -> Iterator[HFBatch]:
        return iter(self.buckets)

    def filter(self, ids: list[str]) -> Buckets | None:
        keep = set(ids)
        kept = []
        for bucket in self.buckets:
            rows = [i for i in bucket.ids if i in keep]
            if rows:
                kept.append(bucket if rows == bucket.ids else bucket.filter(rows))
        if not kept:
            return None
        self.buckets = kept
        self.rebalance()
        return self

    def concatenate(self, other: Buckets) -> Buckets:
        self.buckets += other.buckets
        self.rebalance()
        return self

    # -- the rule -----------------------------------------------------------------------------
    def step_cost(self, rows: int, width: int) -> int:
        """Bytes one decode step of a bucket reads: the weights, and its rows' KV."""
        return self.weight_bytes + rows * width * self.kv_bytes_per_token

    def rebalance(self) -> None:
        """Regroup the rows into the buckets whose steps read least (rows joined or left),
        when what that saves per step repays the copy within ``REPAY_STEPS``."""
        if len(self.buckets) == 1 and self.step_cost(*self.buckets[0].mask.shape) <= self.weight_bytes * 2:
            return  # one bucket whose padding cannot pay for a second forward: the common case
        rows = sorted((w, row_id) for b in self.buckets for row_id, w in zip(b.ids, b.widths(), strict=True))
        groups = self._cheapest_groups([w for w, _ in rows])
        now = sum(self.step_cost(*b.mask.shape) for b in self.buckets)
        best = sum(self.step_cost(len(g), rows[g[-1]][0]) for g in groups)
        wanted = [frozenset(rows[k][1] for k in g) for g in groups]
        have = {frozenset(b.ids) for b in self.buckets}
        # What regrouping copies: the KV of the buckets that are new.
        moved = sum(self.step_cost(len(g), rows[g[-1]][0]) - self.weight_bytes
                    for g, w in zip(groups, wanted, strict=True) if w not in have)
        if set(wanted) == have or now - best <= 0 or moved > (now - best) * REPAY_STEPS:
            return
        self.buckets = [self._gather(w) for w in wanted]

    def _cheapest_groups(self, widths: list[int]) -> list[list[int]]:
        """The partition of rows sorted by width into runs whose steps read least (dynamic
        programming over the split points; a few dozen rows)."""
        n = len(widths)
        best = [0] + [None] * n  # best[j]: the cheapest cost of the first j rows
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j):
                cost = best[i] + self.step_cost(j - i, widths[j - 1])
                if best[j] is None or cost < best[j]:
                    best[j], cut[j] = cost, i
        groups, j = [], n
        while j:
            groups.append(list(range(cut[j], j)))
            j = cut[j]
        return groups[::-1]

    def _gather(self, row_ids: frozenset[str]) -> HFBatch:
        """One bucket of ``row_ids``, taken from the buckets that hold them now."""
        parts = []
        for bucket in self.buckets:
            rows = [i for i in bucket.ids if i in row_ids]
            if rows:
                parts.append(bucket if rows == bucket.ids else bucket.take(rows))
        merged = parts[0]
        for part in parts[1:]:
            merged = merged.concatenate(part)
        return merged
