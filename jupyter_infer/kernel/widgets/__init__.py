"""Notebook widgets: the panel, the batch timeline and the run summary."""

from __future__ import annotations

from .panel import InferPanel
from .run_view import RunView
from .summary import RunSummary, percentile
from .timeline import BatchTimeline, timeline_data

__all__ = ["BatchTimeline", "InferPanel", "RunSummary", "RunView", "percentile", "timeline_data"]
