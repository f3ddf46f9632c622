"""The Responses API's stored answers (``store: true``, OpenAI's default): what
``previous_response_id`` continues, ``GET``/``DELETE infer/v1/responses/{id}`` read and remove.

Kept in memory, per user: a user sees only their own (another's id is as unknown as a made-up
one), each user keeps at most ``per_user`` answers and the server ``total`` answers of at most
``max_bytes`` of JSON in all (bodies may be a megabyte each), the least recently used going
first. A restart forgets them all, which a client learns as a 404 naming the id.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..errors import NotFound
from ..values.request import show

STORE_KEY = "jupyter_infer.responses"  # the web app's settings key of the one store
PER_USER = 256
TOTAL = 4096
MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    """One answer: the response object as it was sent, and the conversation's items it
    answered (the stored ones before it, then its own input)."""

    response: dict[str, Any]
    items: list[dict[str, Any]]
    size: int = 0  # its own JSON's bytes (the items before its input are its predecessors')

    def conversation(self) -> list[dict[str, Any]]:
        """What a response that continues this one reads first: its items, then its output."""
        return [*self.items, *self.response["output"]]


class ResponseStore:
    """Stored responses by user and id, least recently used first out."""

    def __init__(self, per_user: int = PER_USER, total: int = TOTAL, max_bytes: int = MAX_BYTES) -> None:
        self.per_user, self.total, self.max_bytes = per_user, total, max_bytes
        self._all: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self._counts: dict[str, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._all)

    def keep(self, owner: str, stored: StoredResponse) -> None:
        key = (owner, stored.response["id"])
        if key in self._all:
            self._drop(key)
        self._counts[owner] = self._counts.get(owner, 0) + 1
        self._all[key] = stored
        self.bytes += stored.size
        if self._counts[owner] > self.per_user:
            self._drop(next(k for k in self._all if k[0] == owner))
        while len(self._all) > self.total or (self.bytes > self.max_bytes and len(self._all) > 1):
            self._drop(next(iter(self._all)))

    def get(self, owner: str, response_id: str, param: str | None = None) -> StoredResponse:
        """``owner``'s stored response, now the most recently used; a 404 otherwise."""
        key = (owner, response_id)
        if key not in self._all:
            what = "Previous response" if param == "previous_response_id" else "Response"
            raise NotFound(f"{what} with id {show(response_id)} not found: it was not stored (store: false), was "
                           "deleted, was forgotten (the server restarted, or kept newer ones), or is not yours.",
                           param=param)
        self._all.move_to_end(key)
        return self._all[key]

    def delete(self, owner: str, response_id: str) -> None:
        self.get(owner, response_id)
        self._drop((owner, response_id))

    def _drop(self, key: tuple[str, str]) -> None:
        self.bytes -= self._all.pop(key).size
        self._counts[key[0]] -= 1
        if not self._counts[key[0]]:
            del self._counts[key[0]]


def store_of(settings: dict[str, Any]) -> ResponseStore:
    """The web app's one store, made on first use."""
    return settings.setdefault(STORE_KEY, ResponseStore())
