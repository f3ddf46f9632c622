"""The extension's metrics on the server's own Prometheus ``/metrics``.

jupyter_server serves ``prometheus_client``'s default registry, so the metrics live there.
A metric name may be registered once per process, and tests start several servers in one
process: each counter and histogram is created on first use and kept in this module after
that, fed by the records of the service it is attached to. What is read at scrape time (the
queue, the running batch, the event subscribers, the prefix cache) comes from the
``ServiceCollector`` the app creates with its service: registered while the app runs, so no
module global names a service.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..service.protocol import Service
from ..values.metrics import BatchRecord, RequestRecord

_PREFIX = "jupyter_infer_"
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_metrics: dict[str, Any] = {}
log = logging.getLogger(__name__)


def _get(kind: type, name: str, documentation: str, **kwargs: Any) -> Any:
    """The metric ``name``, created once per process in the default registry."""
    if name not in _metrics:
        _metrics[name] = kind(_PREFIX + name, documentation, registry=REGISTRY, **kwargs)
    return _metrics[name]


def requests_total() -> Counter:
    return _get(Counter, "requests", "Requests by outcome (ok, failed, cancelled, rejected).",
                labelnames=["outcome"])


def routed_total() -> Counter:
    return _get(Counter, "routed_requests", "Requests a router sent to each backend, by outcome.",
                labelnames=["route", "outcome"])


def rejected_total() -> Counter:
    return _get(Counter, "rejected", "Requests refused before queueing, by reason.",
                labelnames=["reason"])


def tokens_total() -> Counter:
    return _get(Counter, "tokens", "Tokens processed, by kind (prompt, completion).",
                labelnames=["kind"])


def owner_requests_total() -> Counter:
    # Names, never prompts: a shared server's per-user counts (the scrape is an admin's view).
    return _get(Counter, "owner_requests", "Requests by owner (the Jupyter or hub user) and outcome.",
                labelnames=["owner", "outcome"])


def owner_tokens_total() -> Counter:
    return _get(Counter, "owner_tokens", "Tokens processed by owner and kind (prompt, completion).",
                labelnames=["owner", "kind"])


def ttft_seconds() -> Histogram:
    return _get(Histogram, "time_to_first_token_seconds",
                "From arrival to the first generated token.", buckets=_SECONDS)


def latency_seconds() -> Histogram:
    return _get(Histogram, "request_latency_seconds",
                "From arrival to the last token, for requests that finished ok.", buckets=_SECONDS)


def queue_wait_seconds() -> Histogram:
    return _get(Histogram, "queue_wait_seconds", "From arrival to admission into a batch.",
                buckets=_SECONDS)


def batch_size() -> Histogram:
    return _get(Histogram, "batch_size", "Requests per closed batch record.", buckets=_SIZES)


def _on_request_finished(record: RequestRecord) -> None:
    requests_total().labels(outcome=record.outcome).inc()
    owner_requests_total().labels(owner=record.owner, outcome=record.outcome).inc()
    owner_tokens_total().labels(owner=record.owner, kind="completion").inc(record.completion_tokens)
    if record.first_token_at is not None:
        owner_tokens_total().labels(owner=record.owner, kind="prompt").inc(record.prompt_tokens)
    if record.route is not None:
        routed_total().labels(route=record.route, outcome=record.outcome).inc()
    if record.first_token_at is not None:  # prefilled: only then were its prompt tokens processed
        tokens_total().labels(kind="prompt").inc(record.prompt_tokens)
    tokens_total().labels(kind="completion").inc(record.completion_tokens)
    if record.admitted_at is not None:
        queue_wait_seconds().observe(record.admitted_at - record.queued_at)
    if record.first_token_at is not None:
        ttft_seconds().observe(record.first_token_at - record.queued_at)
    if record.outcome == "ok" and record.finished_at is not None:
        latency_seconds().observe(record.finished_at - record.queued_at)


def speculative_tokens_total() -> Counter:
    return _get(Counter, "speculative_tokens", "Draft tokens of speculative decoding, by outcome "
                "(proposed, accepted by the model).", labelnames=["outcome"])


def _on_batch_closed(batch: BatchRecord) -> None:
    batch_size().observe(len(batch.members))
    if batch.draft_tokens:
        speculative_tokens_total().labels(outcome="proposed").inc(batch.draft_tokens)
        speculative_tokens_total().labels(outcome="accepted").inc(batch.accepted_tokens)


def events_dropped_total() -> Counter:
    return _get(Counter, "events_dropped", "Live events that infer/events subscribers lost by falling behind.")


def _on_rejected(reason: str, outcome: str = "rejected") -> None:
    requests_total().labels(outcome=outcome).inc()
    if outcome == "rejected":
        rejected_total().labels(reason=reason).inc()


def _on_events_dropped(count: int) -> None:
    events_dropped_total().inc(count)


class ServiceCollector:
    """One service's part of ``/metrics``: its records feed the process-wide counters and
    histograms, and its gauges are read from it at each scrape. The app ``attach``es it when
    it starts and ``detach``es it when it stops."""

    GAUGES = (("queue_depth", "Requests waiting to be admitted.", lambda s: s.queue_depth),
              ("running_requests", "Requests in the running batch.", lambda s: s.num_running),
              ("event_subscribers", "Live infer/events subscribers.", lambda s: len(s.events)))
    # The engine's prefix cache keeps its own counters; exported while it is on.
    PREFIX_COUNTERS = (("hits", "Prompts that reused a cached prefix."),
                       ("misses", "Prompts that found no cached prefix."),
                       ("reused_tokens", "Prompt tokens whose KV came from the prefix cache, not a prefill."),
                       ("evicted_blocks", "Blocks dropped to stay within prefix_cache_mb."))
    PREFIX_GAUGES = (("used_mb", "bytes", "Memory the cached blocks hold.", 2**20),
                     ("blocks", "blocks", "Blocks in the prefix cache.", 1))
    # Its blocks on disk (prefix_cache_disk_mb), exported while that is on.
    DISK_COUNTERS = (("hits", "Prefix-cache blocks read back from disk (after a restart or a switch back)."),
                     ("read_tokens", "Prompt tokens whose KV came from the prefix cache's disk."),
                     ("written_blocks", "Prefix-cache blocks written to disk."),
                     ("rejected", "Prefix-cache files refused (corrupt, truncated or another model's) and deleted."))
    # The running rows' KV memory; exported for an engine that keeps KV here.
    KV_GAUGES = (("bytes_held", "bytes", "KV memory the running rows hold (padding and spare room included)."),
                 ("tokens_held", "tokens", "Real tokens in the running rows' KV."),
                 ("waste_ratio", "waste_ratio", "KV bytes held over what the tokens need (1.0: no waste)."),
                 ("shared_tokens", "shared_tokens", "Tokens of prompt prefixes held once for several running rows."))

    def __init__(self, service: Service, registry: CollectorRegistry = REGISTRY) -> None:
        self.service = service
        self.registry = registry
        self._registered = False

    def _listeners(self) -> list[tuple[list[Any], Any]]:
        records = self.service.collector
        return [(records.on_request_finished, _on_request_finished), (records.on_batch_closed, _on_batch_closed),
                (records.on_rejected, _on_rejected), (self.service.events.on_dropped, _on_events_dropped)]

    def attach(self) -> None:
        for listeners, fn in self._listeners():
            listeners.append(fn)
        try:
            self.registry.register(self)
            self._registered = True
        except ValueError:  # the same names already registered: another app that never stopped
            log.warning("jupyter_infer: another inference service in this process still reports its "
                        "gauges to Prometheus; this one's are left out (stop the other server first)")

    def detach(self) -> None:
        """Undo ``attach``; never raises (the app calls it while the server stops)."""
        for listeners, fn in self._listeners():
            if fn in listeners:
                listeners.remove(fn)
        if self._registered:
            self._registered = False
            try:
                self.registry.unregister(self)
            except KeyError:
                pass  # already gone

    # -- what prometheus_client calls ---------------------------------------------------------
    def describe(self) -> list[Any]:
        """Every family this collector may yield (the registry refuses a name twice)."""
        return self._gauges(None) + self._prefix_cache({}) + self._kv_cache({})

    def collect(self) -> list[Any]:
        stats, kv = self.service.prefix_cache(), self.service.kv_cache()
        return (self._gauges(self.service) + (self._prefix_cache(stats) if stats and stats.get("enabled") else [])
                + (self._kv_cache(kv) if kv else []))

    def _gauges(self, service: Service | None) -> list[Any]:
        return [GaugeMetricFamily(_PREFIX + name, text, value=read(service) if service is not None else 0)
                for name, text, read in self.GAUGES]

    def _prefix_cache(self, stats: dict[str, Any]) -> list[Any]:
        out: list[Any] = [CounterMetricFamily(f"{_PREFIX}prefix_cache_{key}", text, value=stats.get(key, 0))
                          for key, text in self.PREFIX_COUNTERS]
        out += [GaugeMetricFamily(f"{_PREFIX}prefix_cache_{name}", text, value=stats.get(key, 0) * scale)
                for key, name, text, scale in self.PREFIX_GAUGES]
        disk = stats.get("disk") or {}
        if disk.get("enabled"):
            out += [CounterMetricFamily(f"{_PREFIX}prefix_cache_disk_{key}", text, value=disk.get(key, 0))
                    for key, text in self.DISK_COUNTERS]
            out.append(GaugeMetricFamily(f"{_PREFIX}prefix_cache_disk_used_bytes", "Disk the cached blocks' files hold.",
                                         value=disk.get("used_mb", 0) * 2**20))
        return out

    def _kv_cache(self, usage: dict[str, Any]) -> list[Any]:
        return [GaugeMetricFamily(f"{_PREFIX}kv_cache_{name}", text, value=usage.get(key) or 0)
                for key, name, text in self.KV_GAUGES]
