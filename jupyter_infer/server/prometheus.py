"""The extension's counters and histograms on the server's own Prometheus ``/metrics``.

jupyter_server serves ``prometheus_client``'s default registry, so the metrics live there.
A metric name may be registered once per process, and tests start several servers in one
process: each metric is created on first use and kept in this module after that.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..metrics import BatchRecord, RequestRecord
from ..service import InferenceService

_PREFIX = "jupyter_infer_"
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_metrics: dict[str, Any] = {}
_service: InferenceService | None = None  # the one whose queue the gauges read


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


def queue_depth() -> Gauge:
    return _get(Gauge, "queue_depth", "Requests waiting to be admitted.")


def running() -> Gauge:
    return _get(Gauge, "running_requests", "Requests in the running batch.")


class PrefixCacheCollector:
    """The engine's prefix cache, read at scrape time: the engine keeps its own counters."""

    COUNTERS = (("hits", "Prompts that reused a cached prefix."),
                ("misses", "Prompts that found no cached prefix."),
                ("reused_tokens", "Prompt tokens whose KV came from the prefix cache, not a prefill."),
                ("evicted_blocks", "Blocks dropped to stay within prefix_cache_mb."))
    GAUGES = (("used_mb", "bytes", "Memory the cached blocks hold.", 2**20),
              ("blocks", "blocks", "Blocks in the prefix cache.", 1))

    def describe(self) -> list[Any]:
        return self._families({})

    def collect(self) -> list[Any]:
        stats = _service.prefix_cache() if _service is not None else None
        return self._families(stats) if stats and stats.get("enabled") else []

    def _families(self, stats: dict[str, Any]) -> list[Any]:
        out: list[Any] = [CounterMetricFamily(f"{_PREFIX}prefix_cache_{key}", text, value=stats.get(key, 0))
                          for key, text in self.COUNTERS]
        out += [GaugeMetricFamily(f"{_PREFIX}prefix_cache_{name}", text, value=stats.get(key, 0) * scale)
                for key, name, text, scale in self.GAUGES]
        return out


def _on_request_finished(record: RequestRecord) -> None:
    requests_total().labels(outcome=record.outcome).inc()
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


def _on_batch_closed(batch: BatchRecord) -> None:
    batch_size().observe(len(batch.members))


def events_dropped_total() -> Counter:
    return _get(Counter, "events_dropped", "Live events that infer/events subscribers lost by falling behind.")


def event_subscribers() -> Gauge:
    return _get(Gauge, "event_subscribers", "Live infer/events subscribers.")


def _on_rejected(reason: str, outcome: str = "rejected") -> None:
    requests_total().labels(outcome=outcome).inc()
    if outcome == "rejected":
        rejected_total().labels(reason=reason).inc()


def _on_events_dropped(count: int) -> None:
    events_dropped_total().inc(count)


def attach(service: InferenceService) -> None:
    """Feed ``service``'s records into the process-wide metrics; its queue drives the gauges."""
    global _service
    metrics = service.collector
    metrics.on_request_finished.append(_on_request_finished)
    metrics.on_batch_closed.append(_on_batch_closed)
    metrics.on_rejected.append(_on_rejected)
    service.events.on_dropped.append(_on_events_dropped)
    _service = service
    if "prefix_cache" not in _metrics:  # a collector, like every metric, registers once per process
        _metrics["prefix_cache"] = PrefixCacheCollector()
        REGISTRY.register(_metrics["prefix_cache"])
    queue_depth().set_function(lambda: _service.queue_depth if _service else 0)
    running().set_function(lambda: _service.num_running if _service else 0)
    event_subscribers().set_function(lambda: len(_service.events) if _service else 0)


def detach(service: InferenceService) -> None:
    global _service
    metrics = service.collector
    for listeners, fn in (
        (metrics.on_request_finished, _on_request_finished),
        (metrics.on_batch_closed, _on_batch_closed),
        (metrics.on_rejected, _on_rejected),
    ):
        if fn in listeners:
            listeners.remove(fn)
    if _on_events_dropped in service.events.on_dropped:
        service.events.on_dropped.remove(_on_events_dropped)
    if _service is service:
        _service = None
