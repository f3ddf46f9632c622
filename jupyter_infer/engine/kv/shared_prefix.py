"""Shared prefixes: the keys and values of a prompt's start that several running rows begin
with, held once.

A row whose prompt starts with blocks in the prefix cache does not copy them into its own
dense cache: it refers to a ``SharedPrefix``, one contiguous copy of those blocks, which every
row starting with the same blocks refers to as well (``ragged.block_attention`` reads it once a
step for all of them, where dense rows would each read their own copy). The live segments are
found by the chain keys of their blocks (``prefix_cache.chain_keys``); a segment serves any
leading run of its blocks (``head``: a view, no copy), and lives while a row refers to it (the
registry holds it weakly), whatever the prefix cache evicts meanwhile. A segment is made only
for a prefix another running row starts with too (its ``Claim``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .prefix_cache import chain_keys


class SharedPrefix:
    """Keys and values of a prompt prefix, ``[layers, 2, kv heads, length, head dim]``; a
    ``head`` of a longer segment is a view of it (and keeps it alive)."""

    def __init__(self, kv: torch.Tensor, root: SharedPrefix | None = None) -> None:
        self.kv = kv
        self._root = root  # not ``self`` for a root: a cycle would outlive its last row until a GC pass
        self._heads: weakref.WeakValueDictionary[int, SharedPrefix] = weakref.WeakValueDictionary()

    @property
    def root(self) -> SharedPrefix:
        """The segment whose memory this is (itself, or the one it is a head of)."""
        return self._root or self

    @property
    def length(self) -> int:
        return self.kv.shape[3]

    @property
    def nbytes(self) -> int:
        """What the whole segment holds (a head's root included once)."""
        kv = self.root.kv
        return kv.numel() * kv.element_size()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values, ``[1, kv heads, length, head dim]`` each."""
        return self.kv[index, 0][None], self.kv[index, 1][None]

    def head(self, length: int) -> SharedPrefix:
        """The first ``length`` tokens: one object per length, so rows that share it can share
        a bucket."""
        if length == self.length:
            return self
        head = self._heads.get(length)
        if head is None:
            head = self._heads[length] = SharedPrefix(self.kv[:, :, :, :length], self.root)
        return head


class Claim:
    """A running row's prompt, by the chain keys of its full blocks: what a newcomer may
    share with it. It lives as long as the row (the row holds it; the registry, weakly)."""

    __slots__ = ("keys", "__weakref__")

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys


class SharedPrefixes:
    """The live segments, by the chain key of each of their blocks, and the running rows'
    claims. A prefix is shared when it pays: when another running row starts with it too (a
    system prompt several agents send at once). A prefix only one row uses (a conversation's
    own history, its next turn) is copied into that row's cache as before: a row after a
    shared prefix can only share a bucket with rows after the same one."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._by_key: weakref.WeakValueDictionary[bytes, SharedPrefix] = weakref.WeakValueDictionary()
        self._claims: weakref.WeakSet[Claim] = weakref.WeakSet()

    def claim(self, tokens: Sequence[int]) -> Claim | None:
        """A claim on ``tokens``' full blocks, for the row to hold (``None``: it has none)."""
        blocks = len(tokens) // self.block_tokens
        if not blocks:
            return None
        claim = Claim(frozenset(chain_keys(tokens, blocks, self.block_tokens)))
        self._claims.add(claim)
        return claim

    def share(self, tokens: Sequence[int], matched: int, kv: torch.Tensor) -> SharedPrefix | None:
        """The shared prefix a row whose first ``matched`` tokens were found in the prefix
        cache (``kv``: their keys and values) refers to: the longest live segment it starts
        with, else a new one of the longest part of its match another running row claims
        too; ``None``: none (the row copies its match)."""
        keys = chain_keys(tokens, matched // self.block_tokens, self.block_tokens)
        for blocks in range(len(keys), 0, -1):
            found = self._by_key.get(keys[blocks - 1])
            if found is not None:
                return found.head(blocks * self.block_tokens)
        claimed = [claim.keys for claim in self._claims]
        for blocks in range(len(keys), 0, -1):
            if any(keys[blocks - 1] in held for held in claimed):
                length = blocks * self.block_tokens
                segment = SharedPrefix(kv if length == matched else kv[:, :, :, :length].contiguous())
                for key in keys[:blocks]:
                    self._by_key[key] = segment
                return segment
        return None
