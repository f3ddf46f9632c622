"""The batch timeline: one row per request, time on the x axis, phases shaded, a colour per
batch, so that one sees at a glance who ran with whom and how newcomers joined.

``timeline_data`` turns ``infer/batches`` records (plus what a client saw itself) into rows;
``BatchTimeline`` is the anywidget that draws them. The widget only holds state; drawing is the
view's job: ``static/timeline.js`` (shipped in the package, no CDN) is built from
``labextension/src/timeline/``, the same renderer as the JupyterLab side panel's timeline
(labextension/README.md). It extends running rows to ``now``, cuts idle gaps out of long
histories and colours decoding by batch size. A constrained request (JSON schema, regex,
choice, grammar, tool calls) gets a badge and an outline, and its tooltip says how many of its
tokens were fast-forwarded (forced by the grammar, not sampled); a batch says how many of its
tokens were, and how many came from draft guesses its model accepted (speculative decoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anywidget
import traitlets

_STATIC = Path(__file__).parent / "static"
_TIMES = ("queued_at", "admitted_at", "first_token_at", "finished_at")


def _span(batch: Mapping[str, Any]) -> tuple[float | None, float | None]:
    return batch.get("started_at"), batch.get("ended_at")


def timeline_data(
    payload: Mapping[str, Any] | list[Mapping[str, Any]],
    ids: Iterable[str] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    observed: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows and batches for the timeline from an ``infer/batches`` answer.

    ``ids`` picks the requests (in that order; default: every request in the payload).
    ``observed`` holds what the client saw for a request id (``queued_at``, ``first_token_at``,
    ``finished_at``, ``tokens``, ``outcome``: epoch seconds), used where the server has no
    record — e.g. a server that returns batch records only, or a request still running.
    """
    if isinstance(payload, list):
        batch_records, request_records = list(payload), []
    else:
        batch_records = list(payload.get("batches") or [])
        request_records = list(payload.get("requests") or [])
    labels = labels or {}
    observed = observed or {}
    by_id = {r["id"]: r for r in request_records if r.get("id")}
    if ids is None:
        ids = list(by_id) or list(dict.fromkeys(m for b in batch_records for m in b.get("members", [])))
    ids = list(dict.fromkeys(ids))
    wanted = set(ids)
    batches = sorted(
        (b for b in batch_records if wanted & set(b.get("members", []))), key=lambda b: b["id"]
    )
    member_of: dict[str, list[dict[str, Any]]] = {}
    for b in batches:
        for m in b.get("members", []):
            member_of.setdefault(m, []).append(b)

    rows = [_row(rid, by_id.get(rid, {}), observed.get(rid, {}), member_of.get(rid, []), labels) for rid in ids]
    out_batches = [
        {
            "id": b["id"],
            "mode": b.get("mode"),
            "started_at": b.get("started_at"),
            "ended_at": b.get("ended_at"),
            "size": b.get("size", len(b.get("members", []))),
            "members": list(b.get("members", [])),
            "steps": b.get("steps", 0),
            "tokens": b.get("tokens", 0),
            "forced_tokens": b.get("forced_tokens", 0),
            # Speculative decoding: draft tokens proposed, and those kept (the tooltip says so).
            "draft_tokens": b.get("draft_tokens", 0),
            "accepted_tokens": b.get("accepted_tokens", 0),
        }
        for b in batches
    ]
    return rows, out_batches


_PROGRESS = {None: 0, "queued": 1, "running": 2}  # any other outcome: the request ended



def _row(rid: str, record: Mapping[str, Any], seen: Mapping[str, Any], spans: list[dict[str, Any]],
         labels: Mapping[str, str]) -> dict[str, Any]:
    """One request's row: its record, what the client saw where there is none, its batches."""
    batch_ids = list(record.get("batch_ids") or [])
    for b in spans:  # batches the record does not know yet (or no record at all)
        if b["id"] not in batch_ids:
            batch_ids.append(b["id"])
    batch_ids.sort()
    row = {
        "id": rid,
        # On a shared server another user's request is an anonymous record (server/viewer.py).
        "label": labels.get(rid, "another user" if record.get("anonymous") else rid),
        "parked_at": record.get("parked_at") or [],
        "resumed_at": record.get("resumed_at") or [],
        "queued_at": record.get("queued_at") or seen.get("queued_at"),
        "admitted_at": record.get("admitted_at"),
        "first_token_at": record.get("first_token_at") or seen.get("first_token_at"),
        "finished_at": record.get("finished_at") or seen.get("finished_at"),
        "batch_ids": batch_ids,
        "outcome": _outcome(record.get("outcome"), seen.get("outcome")),
        "tokens": record.get("completion_tokens") or seen.get("tokens") or 0,
        "constraint": record.get("constraint"),  # its kind ("json_schema", "tools", ...) or None
        "forced_tokens": record.get("forced_tokens") or 0,
    }
    if row["admitted_at"] is None and spans:
        row["admitted_at"] = min(s for s, _ in map(_span, spans) if s is not None)
    if row["finished_at"] is None and spans and all(e is not None for _, e in map(_span, spans)):
        if row["outcome"] not in ("running", "queued"):
            row["finished_at"] = max(e for _, e in map(_span, spans))
    return row

def _outcome(recorded: str | None, seen: str | None) -> str:
    """The server's outcome, unless it is still live and the client has seen the request get
    further since that record was fetched: its first token, or its end (a cancelled request
    is retired at the server's next step)."""
    if recorded not in _PROGRESS:
        return recorded
    if seen not in _PROGRESS:
        return seen
    return max(recorded, seen, key=_PROGRESS.__getitem__) or "running"


class BatchTimeline(anywidget.AnyWidget):
    """Draws request rows (queued / prefill / decoding) coloured by the batch they ran in.

    ``BatchTimeline.from_batches(client.batches(limit=100))`` draws any past run.
    """

    _esm = _STATIC / "timeline.js"
    _css = _STATIC / "timeline.css"

    requests = traitlets.List(traitlets.Dict(), help="One row per request (see timeline_data).").tag(sync=True)
    batches = traitlets.List(traitlets.Dict(), help="Batch records that hold those requests.").tag(sync=True)
    now = traitlets.Float(None, allow_none=True, help="Where running rows end (epoch s).").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def load(
        self,
        payload: Mapping[str, Any] | list[Mapping[str, Any]],
        ids: Iterable[str] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        observed: Mapping[str, Mapping[str, Any]] | None = None,
        now: float | None = None,
    ) -> None:
        """Replace what is drawn with ``timeline_data(payload, ids, ...)``."""
        rows, batches = timeline_data(payload, ids, labels=labels, observed=observed)
        with self.hold_sync():
            self.requests = rows
            self.batches = batches
            self.now = now

    @classmethod
    def from_batches(
        cls, payload: Mapping[str, Any] | list[Mapping[str, Any]], ids: Iterable[str] | None = None,
        *, labels: Mapping[str, str] | None = None, title: str = "",
    ) -> BatchTimeline:
        """A timeline of a past run, from an ``infer/batches`` answer."""
        widget = cls(title=title)
        widget.load(payload, ids, labels=labels)
        return widget

    @classmethod
    def from_client(
        cls, client: Any, ids: Iterable[str] | None = None, *, limit: int = 100,
        labels: Mapping[str, str] | None = None, title: str = "",
    ) -> BatchTimeline:
        """A timeline of the last ``limit`` batches the client's engine ran."""
        return cls.from_batches(client.batches(limit=limit), ids, labels=labels, title=title)

    @property
    def request_ids(self) -> list[str]:
        return [r["id"] for r in self.requests]

    @property
    def batch_ids(self) -> list[int]:
        return [b["id"] for b in self.batches]
