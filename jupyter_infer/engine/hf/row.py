"""One running sequence as the hf engine holds it, besides its KV columns (those live in its
batch's dense tensors, ``batch.py``): how it chooses its tokens, what it feeds next, its
draft model's KV, and what it shares. A batch is tensors plus a list of these; a row that moves
(a bucket regroups, a row parks or resumes) takes all of it along, and a row that leaves frees
all of it. New per-row state is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...decoding.sampling import RowSampler
    from ...speculative.draft_model import DraftKV
    from ..kv.shared_prefix import Claim


@dataclass(eq=False)
class Row:
    """A running row of the hf engine."""

    id: str
    sampler: RowSampler  # its parameters, RNG, logits processors and grammar matcher
    # Its claim on its prompt's blocks, which newcomers may share while it runs (None: none).
    claim: Claim | None = None
    # A grammar's forced run (several tokens) that it feeds whole next step; None: its last token.
    feed: list[int] | None = None
    # Speculation: the draft model's KV of its history (None: no draft model, or it has not
    # guessed yet). How many it guesses is the scheduler's (speculative/guessing.py).
    draft: DraftKV | None = None
