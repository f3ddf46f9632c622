"""The one seam between ``Client`` and where requests run: a server over HTTP, or an engine
in this process. Both backends answer in the contract's JSON shapes (``docs/server.md``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Accepted:
    """The request was queued under this id (before its first token)."""

    request_id: str


@dataclass(frozen=True)
class Fragment:
    """A piece of generated text (one token's text, or a few tokens' when a character spans them)."""

    request_id: str
    text: str


@dataclass(frozen=True)
class Final:
    """The finished request, in ``POST infer/generate``'s JSON shape (usage, batch, timings)."""

    data: dict[str, Any]


StreamItem = Accepted | Fragment | Final


class Backend(Protocol):
    """What a ``Client`` needs from where its requests run. Every coroutine here runs on the
    client's I/O loop; errors are ``jupyter_infer.errors.InferError``s."""

    url: str | None
    token: str | None

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one request to its end; the ``infer/generate`` JSON."""
        ...

    def stream(self, body: dict[str, Any]) -> AsyncIterator[StreamItem]:
        """``Accepted``, then ``Fragment``s as they come, then ``Final`` (when the backend
        knows it). Leaving the iteration early (``aclose``, cancellation) cancels the request."""
        ...

    async def status(self) -> dict[str, Any]:
        """The ``infer/status`` JSON: engine, model, device, mode, state, limits."""
        ...

    async def metrics(self) -> dict[str, Any]:
        """The ``infer/metrics`` JSON."""
        ...

    async def batches(self, limit: int = 50, requests: int | None = None) -> dict[str, Any]:
        """The ``infer/batches`` JSON: recent batch and request records."""
        ...

    async def models(self, method: str = "GET", body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``infer/models``: list (GET), load one (POST ``{"model": ...}``) or unload (DELETE)."""
        ...

    async def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False if no such request is in flight."""
        ...

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait until the engine is loaded; the status then."""
        ...

    async def close(self) -> None:
        """Release connections (and an engine this backend owns)."""
        ...
