"""Request and batch records, and aggregates over everything, in bounded memory.

The last ``keep`` records are kept whole (for ``infer/batches`` and the timeline);
aggregates (counts, percentiles, histograms) cover every request since start, using
log-spaced buckets so that memory does not grow with traffic.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# monotonic → wall clock, so records can be drawn against real time by any client.
_EPOCH = time.time() - time.monotonic()


def wall(t: float | None) -> float | None:
    return None if t is None else round(_EPOCH + t, 6)


def percentile(values: Sequence[float | None], q: float) -> float | None:
    """The exact ``q``-th percentile (0..100) of a run's values, interpolated linearly like
    numpy's default; ``None`` values are skipped, and no values give ``None``."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass
class RequestRecord:
    id: str
    priority: int
    prompt_tokens: int
    queued_at: float
    owner: str = "local"  # who sent it (views show it only to them, and to admins)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    completion_tokens: int = 0
    batch_id: int | None = None  # the batch it was admitted into
    batch_size: int = 0  # that batch's size at admission
    batch_ids: list[int] = field(default_factory=list)  # every span it ran in
    outcome: str = "queued"  # queued | running | ok | cancelled | failed
    finish_reason: str | None = None
    error: str | None = None
    route: str | None = None  # the router's backend that ran it
    constraint: str | None = None  # what its answer was held to (a constraint's kind), if anything
    forced_tokens: int = 0  # of its tokens, those its grammar forced (fast-forward, no sampling)
    # When it sat out for another owner's request (fair share), and when it came back.
    parked_at: list[float] = field(default_factory=list)
    resumed_at: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("queued_at", "admitted_at", "first_token_at", "finished_at"):
            out[key] = wall(out[key])
        out["parked_at"] = [wall(t) for t in self.parked_at]
        out["resumed_at"] = [wall(t) for t in self.resumed_at]
        return out


@dataclass
class BatchRecord:
    id: int
    mode: str
    members: list[str]
    started_at: float
    owners: list[str] = field(default_factory=list)  # each member's owner (views hide others')
    ended_at: float | None = None
    steps: int = 0
    prefill_steps: int = 0
    tokens: int = 0  # generated tokens
    prompt_tokens: int = 0  # tokens prefilled in this batch
    forced_tokens: int = 0  # of its tokens, those grammars forced (fast-forward)
    draft_tokens: int = 0  # speculation: draft tokens its rows proposed
    accepted_tokens: int = 0  # and those their model agreed with (tokens beyond one a row a step)
    # "engine": rows stepped together here; "upstream": requests in flight together on an
    # upstream server (which batches them its own way)
    source: str = "engine"
    route: str | None = None  # the router's backend it ran on

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["size"] = len(self.members)
        out["started_at"] = wall(self.started_at)
        out["ended_at"] = wall(self.ended_at)
        return out


class LogHistogram:
    """Percentiles from log-spaced buckets (±2.5 %), in constant memory."""

    def __init__(self, lo: float = 0.01, hi: float = 3.6e6, ratio: float = 1.05) -> None:
        n = int(math.log(hi / lo) / math.log(ratio)) + 1
        self._edges = [lo * ratio**i for i in range(n)]
        self._counts = [0] * (n + 1)
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._edges, value)] += 1
        self.count += 1
        self.total += value

    def percentile(self, q: float) -> float | None:
        if not self.count:
            return None
        rank = q / 100 * self.count
        seen = 0
        for i, c in enumerate(self._counts):
            seen += c
            if seen >= rank and c:
                if i == 0:
                    return self._edges[0]
                if i >= len(self._edges):
                    return self._edges[-1]
                return round(math.sqrt(self._edges[i - 1] * self._edges[i]), 3)
        return self._edges[-1]

    def summary(self) -> dict[str, float | None]:
        return {
            "p50": self.percentile(50),
            "p95": self.percentile(95),
            "p99": self.percentile(99),
            "mean": round(self.total / self.count, 3) if self.count else None,
        }


class MetricsCollector:
    """Aggregates of one service. With a ``parent`` (the router's collector), every fact is
    also passed up, so the parent holds the totals over all its backends."""

    def __init__(self, keep: int = 1000, parent: MetricsCollector | None = None) -> None:
        self.parent = parent
        self.requests: dict[str, RequestRecord] = {}  # live (queued or running)
        self.finished_records: deque[RequestRecord] = deque(maxlen=keep)
        self.batches: deque[BatchRecord] = deque(maxlen=keep)
        self.outcomes: Counter[str] = Counter()
        self.ttft_ms = LogHistogram()
        self.latency_ms = LogHistogram()
        self.queue_ms = LogHistogram()
        self.step_rows: Counter[int] = Counter()  # running rows per decode step
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.busy_s = 0.0  # engine time spent in steps
        self.max_queue_depth = 0
        self.parked_rows = 0  # rows that sat out for another owner's (fair share)
        self.decode_tokens = 0  # tokens decode steps produced (several a row with speculation)
        self.draft_tokens = 0  # speculation: draft tokens proposed, and accepted by the model
        self.accepted_tokens = 0
        # Per owner: finished requests by outcome, their tokens, times parked (never prompts).
        self.owners: dict[str, Counter[str]] = {}
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) for the last 10 s
        self.started_at = time.monotonic()
        # Called with each finished RequestRecord / closed BatchRecord (e.g. Prometheus).
        self.on_request_finished: list[Callable[[RequestRecord], None]] = []
        self.on_batch_closed: list[Callable[[BatchRecord], None]] = []
        self.on_rejected: list[Callable[[str, str], None]] = []

    # -- request lifecycle (the records are the sequences' own: written once) ----------------
    def queued(self, record: RequestRecord, depth: int) -> None:
        self.requests[record.id] = record
        self.max_queue_depth = max(self.max_queue_depth, depth)
        if self.parent:
            self.parent.queued(record, depth)

    def rejected(self, reason: str, outcome: str = "rejected") -> None:
        """A request that never reached the queue: refused (4xx), or ``failed`` (a 5xx)."""
        self.outcomes[outcome] += 1
        for listener in self.on_rejected:
            listener(reason, outcome)
        if self.parent:
            self.parent.rejected(reason, outcome)

    def admitted(self, record: RequestRecord) -> None:
        self.queue_ms.add((record.admitted_at - record.queued_at) * 1000)
        if self.parent:
            self.parent.admitted(record)

    def first_token(self, record: RequestRecord) -> None:
        self.ttft_ms.add((record.first_token_at - record.queued_at) * 1000)
        self.prompt_tokens += record.prompt_tokens  # prefilled: only now were they processed
        if self.parent:
            self.parent.first_token(record)

    def prompt_counted(self, record: RequestRecord, was: int) -> None:
        """An upstream reported the real prompt size of a request counted as ``was``."""
        if record.first_token_at is not None:
            self.prompt_tokens += record.prompt_tokens - was
        if self.parent:
            self.parent.prompt_counted(record, was)

    def finished(self, record: RequestRecord) -> None:
        if self.requests.pop(record.id, None) is None:
            return
        self.outcomes[record.outcome] += 1
        self.completion_tokens += record.completion_tokens
        counts = self.owners.setdefault(record.owner, Counter())
        counts[record.outcome] += 1
        counts["prompt_tokens"] += record.prompt_tokens if record.first_token_at is not None else 0
        counts["completion_tokens"] += record.completion_tokens
        counts["parked"] += len(record.parked_at)
        if record.outcome == "ok":
            self.latency_ms.add((record.finished_at - record.queued_at) * 1000)
        self.finished_records.append(record)
        for listener in self.on_request_finished:
            listener(record)
        if self.parent:
            self.parent.finished(record)

    # -- steps and batches ------------------------------------------------------------------
    def step(self, kind: str, rows: int, tokens: int, seconds: float, at: float,
             drafts: tuple[int, int] = (0, 0)) -> None:
        self.busy_s += seconds
        if kind == "decode":
            self.step_rows[rows] += 1
            self.decode_tokens += tokens
            self.draft_tokens += drafts[0]
            self.accepted_tokens += drafts[1]
        self._recent.append((at, tokens))
        while self._recent and self._recent[0][0] < at - 10.0:
            self._recent.popleft()
        if self.parent:
            self.parent.step(kind, rows, tokens, seconds, at, drafts)

    def parked(self) -> None:
        self.parked_rows += 1
        if self.parent:
            self.parent.parked()

    def busy(self, seconds: float) -> None:
        """Time the engine worked outside steps (an upstream with requests in flight)."""
        self.busy_s += seconds
        if self.parent:
            self.parent.busy(seconds)

    def batch_closed(self, batch: BatchRecord) -> None:
        self.batches.append(batch)
        for listener in self.on_batch_closed:
            listener(batch)
        if self.parent:
            self.parent.batch_closed(batch)

    # -- views ------------------------------------------------------------------------------
    def recent_batches(self, limit: int = 50) -> list[BatchRecord]:
        return list(self.batches)[-limit:] if limit > 0 else []

    def request_records(self, limit: int = 200) -> list[RequestRecord]:
        live = sorted(self.requests.values(), key=lambda r: r.queued_at)
        return (list(self.finished_records) + live)[-limit:] if limit > 0 else []

    def snapshot(self, queue_depth: int = 0, running: int = 0) -> dict[str, Any]:
        now = time.monotonic()
        steps = sum(self.step_rows.values())
        mean_batch = sum(k * v for k, v in self.step_rows.items()) / steps if steps else None
        recent_window = min(10.0, now - self.started_at) or 1.0
        return {
            "requests": {
                "ok": self.outcomes["ok"],
                "failed": self.outcomes["failed"],
                "cancelled": self.outcomes["cancelled"],
                "rejected": self.outcomes["rejected"],
                "queued": queue_depth,
                "running": running,
            },
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
            "ttft_ms": self.ttft_ms.summary(),
            "latency_ms": self.latency_ms.summary(),
            "queue_ms": self.queue_ms.summary(),
            "tokens_per_s": round(self.completion_tokens / self.busy_s, 2) if self.busy_s else None,
            # Only the last 10 s: an idle server's rate falls to 0 (the window is trimmed on steps only).
            "recent_tokens_per_s": round(sum(t for at, t in self._recent if at >= now - 10.0) / recent_window, 2),
            "mean_batch_size": None if mean_batch is None else round(mean_batch, 3),
            "batch_size_histogram": {str(k): v for k, v in sorted(self.step_rows.items())},
            "queue_depth": queue_depth,
            "max_queue_depth": self.max_queue_depth,
            "uptime_s": round(now - self.started_at, 3),
            "parked_rows": self.parked_rows,
            "speculative": {
                "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": round(self.accepted_tokens / self.draft_tokens, 3) if self.draft_tokens else None,
                # tokens a decoding row gets per decode step (1.0 without speculation)
                "tokens_per_row_step": (round(self.decode_tokens / sum(k * v for k, v in self.step_rows.items()), 3)
                                        if self.step_rows else None),
            },
            # finished requests per owner; the live ones are added by the service
            "owners": {owner: dict(counts) for owner, counts in self.owners.items()},
        }
