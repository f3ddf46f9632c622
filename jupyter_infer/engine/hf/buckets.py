"""Length buckets: the decoding rows as a few dense batches of similar lengths.

One dense left-padded batch makes every row as long as the longest: a 900-token prompt among
~20-token ones has every short row hold, and read at every step, ~900 columns of padding. Here
the decoding rows are one or more ``HFBatch`` buckets, each dense (TGI's layout); one forward
runs them all (``ragged.py``: the linears over every row's tokens, attention bucket by bucket).
The rule is a cost, in bytes read per decode step: a bucket costs its rows' keys and values
(rows × width × bytes per token) and an overhead of its own (``bucket_bytes``: its attention
calls; a second read of every weight for a model that needs a forward per bucket). When rows
join or leave, the rows sorted by length are cut into the runs whose steps cost least (a small
dynamic program), and the buckets are regrouped so when what that saves per step repays the
copy soon: a long prompt among short ones gets a bucket of its own once the padding it makes
the others carry costs more than a bucket, and buckets merge again when the rows that kept
them apart leave. Rows grow by a column a step together, so the padding between two buckets
stays what it was: the decision changes only when rows join or leave.

Equal prompts (a burst) stay one bucket. Rows that start with a shared prefix (held once,
``shared_prefix.py``) are bucketed among themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .batch import HFBatch

# A regrouping copies the KV of the rows it moves: worth it when the reads it saves per step
# repay that copy within this many steps.
REPAY_STEPS = 16


@dataclass
class Buckets:
    """The decoding rows, bucket after bucket; ``ids`` in that order (not the order they
    joined: ``decode`` answers in the plan's order)."""

    buckets: list[HFBatch]
    bucket_bytes: int  # what one more bucket costs a step, in bytes read (HFEngine.bucket_bytes)
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

    def take(self, ids: list[str]) -> Buckets:
        wanted = set(ids)
        taken = [b.take(rows) for b in self.buckets if (rows := [i for i in b.ids if i in wanted])]
        return Buckets(taken, self.bucket_bytes, self.kv_bytes_per_token)

    def concatenate(self, other: Buckets) -> Buckets:
        self.buckets += other.buckets
        self.rebalance()
        return self

    # -- the rule -----------------------------------------------------------------------------
    def step_cost(self, rows: int, width: int) -> int:
        """Bytes one decode step of a bucket costs: its own overhead, and its rows' KV."""
        return self.bucket_bytes + rows * width * self.kv_bytes_per_token

    def rebalance(self) -> None:
        """Regroup the rows into the buckets whose steps read least (rows joined or left),
        when what that saves per step repays the copy within ``REPAY_STEPS``."""
        if len(self.buckets) == 1 and self.step_cost(*self.buckets[0].mask.shape) <= self.bucket_bytes * 2:
            return  # one bucket whose padding cannot pay for a second one: the common case
        # Rows after different shared prefixes never share a dense cache: cut each lot apart.
        lots: dict[int, list[tuple[int, str]]] = {}
        for bucket in self.buckets:
            lots.setdefault(id(bucket.shared), []).extend(zip(bucket.widths(), bucket.ids, strict=True))
        wanted: list[tuple[frozenset[str], int]] = []  # the cheapest buckets and each one's step cost
        for rows in lots.values():
            rows.sort()
            for g in self._cheapest_groups([w for w, _ in rows]):
                wanted.append((frozenset(rows[k][1] for k in g), self.step_cost(len(g), rows[g[-1]][0])))
        now = sum(self.step_cost(*b.mask.shape) for b in self.buckets)
        best = sum(cost for _, cost in wanted)
        have = {frozenset(b.ids) for b in self.buckets}
        # What regrouping copies: the KV of the buckets that are new.
        moved = sum(cost - self.bucket_bytes for ids, cost in wanted if ids not in have)
        if {ids for ids, _ in wanted} == have or now - best <= 0 or moved > (now - best) * REPAY_STEPS:
            return
        self.buckets = [self._gather(ids) for ids, _ in wanted]

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
