"""A batch timeline plus its summary that follows one run of requests as it happens.

Rows start from what the client sees (sent, first token, done); the server's records
(``infer/batches``) replace those guesses with the exact queued / prefill / decoding
phases and batch membership whenever they are fetched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from .summary import RunSummary
from .timeline import BatchTimeline, timeline_data

if TYPE_CHECKING:
    from ..client import Completion


class RunView(widgets.VBox):
    """``view.track(key)``, ``view.record(key, ...)``, ``await view.arefresh(client)``.

    ``key`` names a request before its server id is known (e.g. ``"#3"``); pass
    ``record(key, id="req-…")`` once it is.
    """

    def __init__(self, title: str = "", **kwargs: Any) -> None:
        self.timeline = BatchTimeline(title=title)
        self.summary_html = widgets.HTML()
        super().__init__(children=[self.timeline, self.summary_html], **kwargs)
        self.summary = RunSummary()
        self.reset()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """A widget front end draws the view; elsewhere (nbconvert, a terminal, a notebook
        viewer) its text is the title and the summary."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = self.text
        return bundle

    @property
    def text(self) -> str:
        body = str(self.summary) if self.summary.requests else "no requests yet"
        return f"{self.timeline.title}: {body}" if self.timeline.title else body

    def reset(self) -> None:
        self._server_id: dict[str, str] = {}
        self._labels: dict[str, str] = {}
        self._observed: dict[str, dict[str, Any]] = {}  # by key, in row order
        self._payload: dict[str, Any] = {"batches": [], "requests": []}
        self.redraw()

    # -- what the client saw --------------------------------------------------------------------
    def track(self, key: str, label: str | None = None) -> None:
        self._observed.setdefault(key, {})
        self._labels[key] = label or key

    def record(self, key: str, **fields: Any) -> None:
        """Record client-side facts: ``id``, ``queued_at``, ``first_token_at``, ``finished_at``
        (epoch s), ``tokens``, ``outcome``."""
        self.track(key, self._labels.get(key))
        server_id = fields.pop("id", None)
        if server_id:
            self._server_id[key] = server_id
        self._observed[key].update({k: v for k, v in fields.items() if v is not None})

    def record_completion(self, key: str, completion: Completion) -> None:
        """Record a finished ``Completion`` (its id, send and receive times, tokens, outcome)."""
        self.record(key, id=completion.id, queued_at=completion.sent_at, finished_at=completion.received_at,
                    tokens=completion.completion_tokens, outcome="ok" if completion.ok else "error")

    @property
    def ids(self) -> list[str]:
        """The server ids known so far, in row order."""
        return [self._server_id[k] for k in self._observed if k in self._server_id]

    # -- what the server recorded -----------------------------------------------------------------
    def merge(self, payload: Mapping[str, Any]) -> None:
        """Take the server's records (an ``infer/batches`` answer) for this run's requests."""
        self._payload = {"batches": list(payload.get("batches") or []),
                         "requests": list(payload.get("requests") or [])}

    async def afetch(self, client: Any, limit: int | None = None) -> None:
        """Fetch the server's records for this run (from an asyncio task); no redraw."""
        self.merge(await client.abatches(limit=limit or self._limit()))

    async def arefresh(self, client: Any, limit: int | None = None) -> None:
        """Fetch the server's records and redraw (from an asyncio task)."""
        await self.afetch(client, limit)
        self.redraw()

    def refresh(self, client: Any, limit: int | None = None) -> None:
        """Fetch the server's records and redraw (sync)."""
        self.merge(client.batches(limit=limit or self._limit()))
        self.redraw()

    def _limit(self) -> int:
        return max(100, 6 * len(self._observed))

    # -- drawing --------------------------------------------------------------------------------
    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ids = {k: self._server_id.get(k, k) for k in self._observed}
        labels = {rid: self._labels[k] for k, rid in ids.items()}
        observed = {rid: self._observed[k] for k, rid in ids.items()}
        return timeline_data(self._payload, list(ids.values()), labels=labels, observed=observed)

    def redraw(self, now: float | None = None) -> None:
        rows, batches = self.rows()
        running = any(r["finished_at"] is None for r in rows)
        now = (now or time.time()) if running else None
        self.summary = RunSummary.from_timeline(rows, batches, now)
        with self.timeline.hold_sync():
            self.timeline.requests = rows
            self.timeline.batches = batches
            self.timeline.now = now
        self.summary_html.value = self.summary.to_html() if rows else ""
