"""What one user may see of everyone's requests: their own in full, others' as anonymous rows.

On a shared server (a JupyterHub service, a class on one model) the batch records, live events
and metrics are about everyone's requests. A viewer sees their own requests as they are; a
request of another user keeps what a timeline needs (when it queued, ran and finished, its
token counts, which batches) and loses who sent it, its text and its id: its id becomes an
opaque ``anon-…`` (the same one everywhere it shows, so a timeline can draw its row) that no
route accepts, so nobody can cancel or look up another's request from what they see. Admins
(``InferApp.admin_users``, and hub admins) see everything, as does a single-user server's
one user.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..values.events import coalesce_tokens
from .sse import format_event

ANONYMOUS = "another user"
_KEY = secrets.token_bytes(16)  # per process: anonymous ids cannot be computed from outside
# What an anonymous request record keeps: what a timeline and the figures need, nothing more.
_RECORD_FIELDS = ("priority", "prompt_tokens", "queued_at", "admitted_at", "first_token_at", "finished_at",
                  "completion_tokens", "batch_id", "batch_size", "batch_ids", "outcome", "finish_reason",
                  "route", "constraint", "forced_tokens", "parked_at", "resumed_at")
# The live events' fields that carry text or reasons of the request's own.
_PRIVATE_EVENT_FIELDS = ("text", "error", "prompt")


def anonymous_id(request_id: str) -> str:
    return "anon-" + hashlib.blake2b(request_id.encode(), key=_KEY, digest_size=6).hexdigest()


@dataclass(frozen=True)
class Viewer:
    """Who is looking: ``name`` (an owner), and whether they see everyone's requests."""

    name: str
    sees_all: bool = False

    def owns(self, owner: str | None) -> bool:
        return self.sees_all or owner == self.name

    # -- batch records and request records (infer/batches) ------------------------------------
    def batches(self, payload: dict[str, Any], owner_of: Callable[[str], str | None]) -> dict[str, Any]:
        """``infer/batches`` as this viewer may see it; ``owner_of`` names the owner of a
        live request id (the records name their own)."""
        if self.sees_all:
            return payload
        owners = {r["id"]: r.get("owner") for r in payload.get("requests", [])}

        def mine(request_id: str) -> bool:
            return self.owns(owners[request_id] if request_id in owners else owner_of(request_id))

        out = dict(payload)
        out["requests"] = [r if self.owns(r.get("owner")) else _anonymous_record(r) for r in payload.get("requests", [])]
        out["batches"] = [self._batch(b) for b in payload.get("batches", [])]
        for key in ("running", "waiting", "parked"):
            if key in payload:
                out[key] = [i if mine(i) else anonymous_id(i) for i in payload[key]]
        return out

    def _batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        owners = batch.get("owners") or [None] * len(batch.get("members", []))
        out = dict(batch)
        out["members"] = [m if self.owns(o) else anonymous_id(m) for m, o in zip(batch["members"], owners, strict=True)]
        out["owners"] = [o if self.owns(o) else ANONYMOUS for o in owners]
        return out

    # -- live events (infer/events) --------------------------------------------------------------
    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        if self.sees_all:
            return event
        if event.get("type") in ("batch", "step") and "members" in event:
            return {**event, **self._batch(event)}
        if "id" in event and "owner" in event and not self.owns(event["owner"]):
            if event.get("type") == "token":
                return {"type": "token", "id": anonymous_id(event["id"]), "owner": ANONYMOUS, "index": event.get("index"),
                        **({"route": event["route"]} if "route" in event else {})}
            hidden = {k: v for k, v in event.items() if k not in _PRIVATE_EVENT_FIELDS}
            return {**hidden, "id": anonymous_id(event["id"]), "owner": ANONYMOUS}
        return event

    @property
    def render(self) -> Callable[[list[dict[str, Any]]], str]:
        """The events as SSE frames for this viewer (one function per viewer, so the bus can
        render a span once for every reader who sees the same)."""
        return _renderer(self)

    # -- metrics (infer/metrics) ---------------------------------------------------------------
    def metrics(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The totals stay (they name nobody); per-owner counts only the viewer's own (a
        router's backends' too)."""
        if self.sees_all:
            return payload
        out = dict(payload)
        if "owners" in out:
            out["owners"] = {k: v for k, v in out["owners"].items() if k == self.name}
        if isinstance(out.get("routes"), dict):
            out["routes"] = {name: self.metrics(route) for name, route in out["routes"].items()}
        return out


def _anonymous_record(record: dict[str, Any]) -> dict[str, Any]:
    out = {k: record[k] for k in _RECORD_FIELDS if k in record}
    out.update(id=anonymous_id(record["id"]), owner=ANONYMOUS, anonymous=True)
    return out


@functools.lru_cache(maxsize=256)
def _renderer(viewer: Viewer) -> Callable[[list[dict[str, Any]]], str]:
    def frames(events: list[dict[str, Any]]) -> str:
        return "".join(format_event(json.dumps(e), e["type"]) for e in coalesce_tokens([viewer.event(e) for e in events]))

    return frames


def user_name(user: Any) -> str | None:
    """The name of jupyter_server's ``current_user``: a ``User`` (jupyter_server 2) has a
    ``username``; older identity providers and some deployments give the name as a string."""
    if isinstance(user, str):
        return user or None
    name = getattr(user, "username", None)
    return name if isinstance(name, str) and name else None


def hub_model(user: Any) -> dict[str, Any]:
    """The JupyterHub user model behind ``current_user`` (``name``, ``admin``, ``groups``,
    ``scopes``), or ``{}`` when the server does not authenticate through a hub."""
    model = getattr(user, "hub_user", None)
    return model if isinstance(model, dict) else {}


def owner_weight(name: str, groups: list[str], weights: dict[str, float]) -> float:
    """``name``'s weight in fair share: its own (``"alice": 2``), else its groups' highest
    (``"group:staff": 4``), else 1."""
    if name in weights:
        return float(weights[name])
    return max((float(weights[f"group:{g}"]) for g in groups if f"group:{g}" in weights), default=1.0)
