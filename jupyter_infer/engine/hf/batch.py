"""The rows of a Hugging Face model as one dense value, TGI's ``CausalLMBatch``: a KV cache
left-padded to one length, each row's attention mask, next position and last token, and the
rows themselves (``row.Row``: all the rest a row holds).
``concatenate`` (rows join: both caches left-padded to one length) and ``filter`` (rows leave;
columns only padding uses are trimmed) are the two operations on it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..kv import kv_cache
from ..kv.shared_prefix import SharedPrefix
from .ragged import Block
from .row import Row


def left_pad_rows(rows: Seq[Seq[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one left-padded batch (on the CPU): ids and attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids, mask


def spare_columns(max_tokens: Seq[int | None]) -> int:
    """Columns worth allocating past new rows' prompts: what they can generate (a 32-token
    answer needs 32, not 64), ``SPARE_COLUMNS`` at most, or where unknown."""
    most = max(kv_cache.SPARE_COLUMNS if n is None else n for n in max_tokens)
    return max(1, min(kv_cache.SPARE_COLUMNS, most))


def row_ends(rows: Seq[tuple[int, int | None]], device: str) -> torch.Tensor:
    """Each row's position once it has all its tokens: ``(prompt length, max_tokens)`` per row
    (no ``max_tokens``: as far as positions go)."""
    return torch.tensor([n + (2**31 if m is None else m) for n, m in rows], device=device)


@dataclass
class HFBatch:
    """The running rows: tensors (KV cache, attention mask, next positions, last tokens, ends)
    whose row ``i`` is ``rows[i]``'s."""

    rows: list[Row]
    cache: DynamicCache
    mask: torch.Tensor  # [rows, cache_len] 1 = real token
    positions: torch.Tensor  # [rows] position id of the next token
    last: torch.Tensor  # [rows] the token to feed next
    ends: torch.Tensor  # [rows] the position at which a row has all its tokens (prompt + max_tokens)
    _mask_buf: torch.Tensor | None = None  # ``mask`` is a view of it, with spare columns
    # The prompt prefix every row starts with, held once (shared_prefix.py); the cache and
    # mask are the columns after it.
    shared: SharedPrefix | None = None

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.rows]

    def __post_init__(self) -> None:
        # Decided when rows join (a batch is made) or leave (``filter``), not every step.
        kv_cache.set_spare(self.cache, self.spare())

    def spare(self) -> int:
        """Room worth allocating ahead: what the rows can still use, at most ``SPARE_COLUMNS``."""
        return spare_columns([int((self.ends - self.positions).max())])

    def took(self, tokens: list[list[int]]) -> None:
        """The step's tokens per row: the last is fed next; a run of several, all of it."""
        self.last = torch.tensor([t[-1] for t in tokens], dtype=torch.long, device=self.last.device)
        for row, t in zip(self.rows, tokens, strict=True):
            row.feed = t if len(t) > 1 else None

    def feeds(self, drafts: dict[str, list[int]] | None = None) -> list[list[int]] | None:
        """What each row feeds next when some row has a forced run or draft tokens to verify
        after its last (``None``: one token each)."""
        drafts = drafts or {}
        if not any(r.feed or r.id in drafts for r in self.rows):
            return None
        last = self.last.tolist()
        return [r.feed or [t, *drafts.get(r.id, ())] for r, t in zip(self.rows, last, strict=True)]

    def next_block(self, pad_id: int, drafts: dict[str, list[int]] | None = None) -> Block:
        """The next decode step's input: each row's last token, or where a grammar forced a
        run (or a row has ``drafts`` to verify), every row's uncomputed tokens left-padded
        (positions per row); the mask grows by as many columns."""
        feeds = self.feeds(drafts)
        if feeds is None:
            return Block(self.cache, self.last[:, None], self.extend_mask(), self.positions[:, None], self.shared)
        ids, new = (t.to(self.last.device) for t in left_pad_rows(feeds, pad_id))
        positions = self.positions[:, None] + (new.cumsum(-1) - 1).clamp(min=0)
        return Block(self.cache, ids, self.extend_mask(new), positions, self.shared)

    def advance(self, block: Block, tokens: list[list[int]]) -> None:
        """After ``block`` ran: positions move past what it fed, ``tokens`` are fed next."""
        width = block.ids.shape[1]
        self.positions = self.positions + (1 if width == 1 else block.mask[:, -width:].sum(-1))
        self.took(tokens)

    def advance_verified(self, block: Block, rejected: list[int], tokens: list[list[int]]) -> None:
        """After ``block`` verified draft tokens: each row's last ``rejected[i]`` fed tokens
        were wrong guesses, so their KV goes: columns every row rejected are cut off the
        cache's end, the rest are masked out (a hole, as a pad column is). Positions move past
        what each row kept; ``tokens`` are what each row feeds next (its model's own token
        after the ones it kept)."""
        width = block.ids.shape[1]
        kept = block.mask[:, -width:].sum(-1) - torch.tensor(rejected, device=self.positions.device)
        self.positions = self.positions + kept
        cut = min(rejected)
        if cut:
            kv_cache.drop_columns(self.cache, cut)
            self.mask = self.mask[:, : self.mask.shape[1] - cut]
        length = self.mask.shape[1]
        for row, n in enumerate(rejected):
            if n > cut:
                self.mask[row, length - (n - cut) :] = 0
        self.took(tokens)

    def filter(self, ids: list[str]) -> HFBatch | None:
        if not ids:
            return None
        at = {row.id: i for i, row in enumerate(self.rows)}
        keep = [at[i] for i in ids]
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask[index]
        # Columns that only departed rows used are pure padding now: trim them.
        start = int(mask.any(dim=0).nonzero()[0])
        self.positions = self.positions[index]
        self.ends = self.ends[index]
        self.rows = [self.rows[i] for i in keep]
        kv_cache.select_rows(self.cache, index, start, self.spare())
        self.mask, self._mask_buf = mask[:, start:], None
        self.last = self.last[index]
        return self

    def take(self, ids: list[str]) -> HFBatch:
        """A new batch of the rows in ``ids`` (this one unchanged): ``filter`` on a copy."""
        clone = HFBatch(list(self.rows), kv_cache.shallow_copy(self.cache), self.mask, self.positions, self.last,
                        self.ends, shared=self.shared)
        return clone.filter(ids)

    def widths(self) -> list[int]:
        """Each row's length in the cache: from its first real column to the end."""
        first = self.mask.argmax(dim=1)  # left padding: the first 1 of each row
        return (self.mask.shape[1] - first).tolist()

    def concatenate(self, other: HFBatch) -> HFBatch:
        """Rows of ``other`` after these, both left-padded to one cache length (rows that
        start with the same shared prefix, or none)."""
        if self.shared is not other.shared:
            raise ValueError("rows after different shared prefixes cannot share a dense cache")
        width = max(self.mask.shape[1], other.mask.shape[1])
        spare = max(self.spare(), other.spare())
        return HFBatch(
            rows=self.rows + other.rows,
            cache=kv_cache.merge(self.cache, other.cache, width, spare),
            mask=torch.cat([kv_cache.left_pad(self.mask, width, 1), kv_cache.left_pad(other.mask, width, 1)]),
            positions=torch.cat([self.positions, other.positions]),
            last=torch.cat([self.last, other.last]),
            ends=torch.cat([self.ends, other.ends]),
            shared=self.shared,
        )

    def extend_mask(self, block: torch.Tensor | None = None) -> torch.Tensor:
        """The mask with one more real-token column (or ``block``'s columns: several tokens
        per row, left-padded), written in place into spare room (a ``torch.cat`` of the whole
        mask every step would copy it all)."""
        rows, length = self.mask.shape
        width = 1 if block is None else block.shape[1]
        buf = self._mask_buf
        if buf is None or buf.shape[1] < length + width:
            buf = self.mask.new_zeros((rows, length + width + kv_cache.SPARE_COLUMNS))
            buf[:, :length] = self.mask
            self._mask_buf = buf
        buf[:, length : length + width] = 1 if block is None else block
        self.mask = buf[:, : length + width]
        return self.mask
