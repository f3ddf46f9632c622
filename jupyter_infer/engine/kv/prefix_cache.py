"""Prefix caching: the KV of prompt prefixes, kept in fixed-size token blocks and reused.

A block holds the keys and values of ``BLOCK_TOKENS`` prompt tokens, for every layer. Blocks
are keyed by a hash chain, as in nano-vllm's ``block_manager.py``: a block's key hashes its
parent's key and its own tokens, so one key stands for the whole prefix up to the block's
end, and a lookup walks the prompt block by block until a key is missing. The store is an
LRU bounded in bytes; a chain is touched leaf first, root last, so that eviction takes the
deep ends of old chains before the shared roots (a system prompt) that everyone reuses.

The engine copies matched blocks into an ordinary dense cache and prefills only the rest of
the prompt (``docs/engine.md`` says why copies rather than a paged cache). Rows keep no
reference to a block, so eviction never has to wait for a running request.

With a ``DiskBlocks`` (``prompt_disk.py``) every new block is also written to disk, and a
lookup goes on there where memory has no more of the chain: a restart, or a model switched
back to, finds its prompts again.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .prompt_disk import DiskBlocks

# Tokens per block. 16 against 32 on the "small" model (docs/engine.md): the same prefill
# time for a 530-token prompt with a 512-token hit, and up to 16 more reusable tokens when
# prompts part mid-block; the per-block cost (a hash, one copy) is noise next to a forward.
BLOCK_TOKENS = 16


@dataclass
class CachedBlock:
    """One full block of a prompt in the cache: its chain key, tokens and KV."""

    key: bytes
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2 (keys, values), kv heads, BLOCK_TOKENS, head dim]


def chain_keys(tokens: Sequence[int], blocks: int, block_tokens: int = BLOCK_TOKENS) -> list[bytes]:
    """The keys of the first ``blocks`` full blocks of ``tokens``: each hashes its parent's key
    and its own tokens (a 128-bit BLAKE2 digest, so that a collision is out of the question)."""
    keys, parent = [], b""
    for i in range(blocks):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(array("q", tokens[i * block_tokens : (i + 1) * block_tokens]).tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """An LRU of KV blocks, at most ``capacity_bytes`` of tensors, with hit counters."""

    def __init__(self, capacity_bytes: int, block_tokens: int = BLOCK_TOKENS, disk: DiskBlocks | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.disk = disk
        self._blocks: OrderedDict[bytes, CachedBlock] = OrderedDict()
        self.used_bytes = 0
        self.hits = 0  # lookups that reused at least one block
        self.misses = 0
        self.reused_tokens = 0
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, tokens: Sequence[int]) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``tokens`` that leaves at least one token to compute
        (its logits give the first new token): its length and its KV, ``[layers, 2, heads,
        length, dim]``, a fresh tensor the caller may keep."""
        usable = (len(tokens) - 1) // self.block_tokens
        n = self.block_tokens
        found: list[CachedBlock] = []
        for i, key in enumerate(chain_keys(tokens, usable, n)):
            block_tokens = tuple(tokens[i * n : (i + 1) * n])
            block = self._blocks.get(key) or self._from_disk(key, block_tokens)
            if block is None or block.tokens != block_tokens:
                break
            found.append(block)
        if not found:
            self.misses += 1
            return 0, None
        self._touch(found)
        self._evict()
        length = len(found) * self.block_tokens
        self.hits += 1
        self.reused_tokens += length
        return length, torch.cat([b.kv for b in found], dim=3)

    def insert(self, tokens: Sequence[int], length: int, kv_of: Callable[[int, int], torch.Tensor]) -> None:
        """Keep the full blocks among the first ``length`` tokens of ``tokens``.
        ``kv_of(start, end)`` gives the KV of tokens ``start..end-1`` (``[layers, 2, heads,
        end - start, dim]``); it is asked only for blocks not stored yet."""
        n = self.block_tokens
        chain: list[CachedBlock] = []
        for i, key in enumerate(chain_keys(tokens, length // n, n)):
            block = self._blocks.get(key)
            if block is None:
                kv = kv_of(i * n, (i + 1) * n).contiguous()
                block = CachedBlock(key, tuple(tokens[i * n : (i + 1) * n]), kv)
                self._keep(block)
                if self.disk is not None:
                    self.disk.write(key, block.tokens, kv)
            chain.append(block)
        self._touch(chain)
        self._evict()

    def _from_disk(self, key: bytes, tokens: tuple[int, ...]) -> CachedBlock | None:
        """A block memory lacks, read back from disk (kept in memory again), or None."""
        kv = self.disk.read(key, tokens) if self.disk is not None else None
        if kv is None:
            return None
        block = CachedBlock(key, tokens, kv)
        self._keep(block)
        return block

    def _keep(self, block: CachedBlock) -> None:
        self._blocks[block.key] = block
        self.used_bytes += block.kv.numel() * block.kv.element_size()

    def _evict(self) -> None:
        while self.used_bytes > self.capacity_bytes and self._blocks:
            _, old = self._blocks.popitem(last=False)
            self.used_bytes -= old.kv.numel() * old.kv.element_size()
            self.evicted_blocks += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.used_bytes = 0

    def stats(self) -> dict[str, Any]:
        lookups = self.hits + self.misses
        return {
            "enabled": True,
            "block_tokens": self.block_tokens,
            "capacity_mb": round(self.capacity_bytes / 2**20, 3),
            "used_mb": round(self.used_bytes / 2**20, 3),
            "blocks": len(self._blocks),
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / lookups, 4) if lookups else None,
            "reused_tokens": self.reused_tokens,
            "evicted_blocks": self.evicted_blocks,
            "disk": self.disk.stats() if self.disk is not None else {"enabled": False},
        }

    def _touch(self, chain: list[CachedBlock]) -> None:
        """Most recent: the root last, so eviction takes leaves before the prefixes they extend."""
        for block in reversed(chain):
            self._blocks.move_to_end(block.key)
