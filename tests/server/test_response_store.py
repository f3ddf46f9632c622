"""The Responses API's stored answers: each user's own, the least recently used first out."""

from __future__ import annotations

import pytest

from jupyter_infer.errors import NotFound
from jupyter_infer.server.response_store import ResponseStore, StoredResponse


def _stored(response_id: str) -> StoredResponse:
    return StoredResponse({"id": response_id, "output": [{"type": "message", "id": f"msg_{response_id}"}]},
                          [{"role": "user", "content": response_id}])


def test_the_store_keeps_each_users_own_least_recently_used_first_out() -> None:
    store = ResponseStore(per_user=2, total=3)
    for rid in ("a1", "a2"):
        store.keep("alice", _stored(rid))
    store.get("alice", "a1")  # used: a2 is now the oldest of alice's
    store.keep("alice", _stored("a3"))
    with pytest.raises(NotFound):
        store.get("alice", "a2")
    with pytest.raises(NotFound):  # another user's id is as unknown as a made-up one
        store.get("bob", "a1")
    store.keep("bob", _stored("b1"))
    store.keep("bob", _stored("b2"))  # four in all, three kept: the least recently used (a1) goes
    assert len(store) == 3
    with pytest.raises(NotFound):
        store.get("alice", "a1")
    assert store.get("alice", "a3").conversation() == [{"role": "user", "content": "a3"},
                                                       {"type": "message", "id": "msg_a3"}]
    store.delete("bob", "b1")
    with pytest.raises(NotFound):
        store.delete("bob", "b1")


def test_the_store_keeps_a_bounded_size() -> None:
    store = ResponseStore(max_bytes=100)
    for rid in ("a1", "a2", "a3"):
        store.keep("alice", StoredResponse(_stored(rid).response, [], size=40))
    assert len(store) == 2 and store.bytes == 80  # the oldest went
    with pytest.raises(NotFound):
        store.get("alice", "a1")
    store.keep("alice", StoredResponse(_stored("big").response, [], size=500))
    assert len(store) == 1 and store.get("alice", "big")  # the newest stays, however large
