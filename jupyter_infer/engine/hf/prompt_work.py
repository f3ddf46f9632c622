"""The prompt side of an ``HFEngine`` step: newcomers' whole prompts, or the next chunk of a
long one, as ragged blocks (``ragged.py``) that run in the same forward as the decoding rows'
blocks (a mixed step) or alone; then, from that forward's logits, the rows they make.

Both kinds answer the same three things: ``blocks`` (what the forward runs), ``rows``
(theirs, ``row.Row``, in block order: their grammars' masks are filled beside the forward) and
``finish(logits, every)`` (their first tokens, the rows whose prompt is complete, the row
still part-way). ``echo``: a row asks for its prompt's logprobs, so the forward must keep
every column's logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from ...decoding.sampling import prompt_logprobs, sample
from ..base import RowOutput, Sampled
from ..kv import kv_cache
from . import ragged
from .batch import HFBatch, left_pad_rows, row_ends, spare_columns
from .row import Row

if TYPE_CHECKING:
    from ...values.step import RowRequest
    from ..kv.prefix_cache import PrefixCache
    from ..kv.shared_prefix import Claim, SharedPrefix
    from .buckets import Buckets

# Where a row starts: the shared prefix it refers to, its cached prompt tokens (shared ones
# included), the KV of the cached ones after the shared prefix.
Start = tuple["SharedPrefix | None", int, "torch.Tensor | None"]


class PromptsDone(NamedTuple):
    """What a step gave its prompt rows: their first tokens (in the plan's order), the rows now
    complete (they join the decoding rows) and those begun (a long prompt part-way)."""

    sampled: Sampled
    complete: Buckets | None
    begun: dict[str, HFBatch]


class PromptRunner(Protocol):
    """What the prompt side asks of the runner that runs its blocks (``HFEngine``, which
    imports this module, not the reverse)."""

    device: str
    model: Any
    pad_token_id: int
    prefix_cache: PrefixCache | None

    def cached_start(self, seq: RowRequest) -> Start:
        """Where ``seq``'s row starts: a shared prefix, its cached tokens, their own KV."""

    def new_row(self, seq: RowRequest) -> Row:
        """A newcomer's row (its sampler)."""

    def claim(self, seq: RowRequest) -> Claim | None:
        """The row's claim on its prompt's blocks, which newcomers may share while it runs."""

    def remember(self, prompt: list[int], start: Start, block: ragged.Block, row: int) -> None:
        """Put a just-prefilled prompt's full blocks in the prefix cache."""

    def buckets(self, batches: list[HFBatch]) -> Buckets:
        """Newly complete rows as the decoding rows hold them."""


class WholePrompts:
    """Newcomers' prompts, whole: a block per shared prefix they start with (or none). A row
    whose prompt starts with a cached prefix starts from that KV, shared or copied: its row
    reads ``[pad | cached | pad | rest]``, the mask hides both pads and ``position_ids``
    continue from the cached length."""

    def __init__(self, engine: PromptRunner, seqs: list[RowRequest]) -> None:
        self.engine, self.seqs = engine, seqs
        self.starts = [engine.cached_start(s) for s in seqs]
        lots: dict[int, list[int]] = {}  # the rows after each shared prefix, in the plan's order
        for i, (shared, _, _) in enumerate(self.starts):
            lots.setdefault(id(shared), []).append(i)
        self.lots = list(lots.values())
        self.order = [i for rows in self.lots for i in rows]
        self.blocks = [self._block([seqs[i] for i in rows], [self.starts[i] for i in rows]) for rows in self.lots]
        self.rows: list[Row] = [engine.new_row(seqs[i]) for i in self.order]
        self.echo = any(s.params.prompt_logprobs is not None for s in seqs)

    def _block(self, seqs: list[RowRequest], starts: list[Start]) -> ragged.Block:
        """The prompts of rows after one shared prefix (or none) as one left-padded block: each
        row's cached part after that prefix, padding, the rest of its prompt."""
        engine = self.engine
        shared = starts[0][0]
        offset = shared.length if shared is not None else 0
        own = [n - offset for _, n, _ in starts]  # cached columns in the row's own cache
        input_ids, new_mask = left_pad_rows([s.prompt_ids[n:] for s, (_, n, _) in zip(seqs, starts, strict=True)],
                                            engine.pad_token_id)
        width = max(own)
        past_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, n in enumerate(own):
            past_mask[row, width - n :] = 1
        mask = torch.cat([past_mask, new_mask], dim=1)
        position_ids = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor([n for _, n, _ in starts])[:, None]
        config = engine.model.config
        cache = kv_cache.with_past(config, [kv for _, _, kv in starts], width) if width else kv_cache.new_cache(config)
        kv_cache.set_spare(cache, spare_columns([s.params.max_tokens for s in seqs]))
        return ragged.Block(cache, *(t.to(engine.device) for t in (input_ids, mask, position_ids)), shared)

    def finish(self, logits: torch.Tensor, every: bool) -> PromptsDone:
        """The first tokens (in ``seqs``' order) and the rows, from the forward's ``logits`` of
        these blocks: each row's last column, or (``every``) every column."""
        engine, seqs = self.engine, self.seqs
        last = logits[ragged.last_columns(self.blocks)] if every else logits
        echoed: dict[int, list] = {}  # row in the plan -> its prompt's logprobs
        first = 0
        for rows, block in zip(self.lots, self.blocks, strict=True):
            for row, i in enumerate(rows):
                engine.remember(seqs[i].prompt_ids, self.starts[i], block, row)
                prompt = seqs[i].prompt_ids
                if every and seqs[i].params.prompt_logprobs is not None:
                    own = logits[first : first + block.tokens].unflatten(0, block.ids.shape)[row, -len(prompt):]
                    echoed[i] = prompt_logprobs(own, prompt, seqs[i].params.prompt_logprobs)
            first += block.tokens
        sampled = sample(last, [r.sampler for r in self.rows])
        batches, at = [], 0
        for lot, block in zip(self.lots, self.blocks, strict=True):
            rows, tokens = self.rows[at : at + len(lot)], [o.tokens for o in sampled[at : at + len(lot)]]
            at += len(lot)
            for row, i, t in zip(rows, lot, tokens, strict=True):
                row.claim = engine.claim(seqs[i])
                row.feed = t if len(t) > 1 else None
            batches.append(HFBatch(
                rows=rows,
                cache=block.cache,
                mask=block.mask,
                positions=torch.tensor([len(seqs[i].prompt_ids) for i in lot], device=engine.device),
                ends=row_ends([(len(seqs[i].prompt_ids), seqs[i].params.max_tokens) for i in lot], engine.device),
                last=torch.tensor([t[-1] for t in tokens], dtype=torch.long, device=engine.device),
                shared=block.shared,
            ))
        back = {i: j for j, i in enumerate(self.order)}
        sampled = [sampled[back[i]] for i in range(len(seqs))]
        for i, records in echoed.items():
            sampled[i].prompt_logprobs = records
        return PromptsDone(sampled, engine.buckets(batches), {})


class PromptChunk:
    """Up to ``budget`` more prompt tokens of ``seq``, continuing ``partial`` (the row so far;
    ``None``: start, from the longest cached prefix). One row, no padding: the mask is all
    ones and positions continue from the tokens already there. The row's first token comes
    with the prompt's last chunk."""

    echo = False  # a request for its prompt's logprobs is never chunked

    def __init__(self, engine: PromptRunner, seq: RowRequest, partial: HFBatch | None, budget: int) -> None:
        self.engine, self.seq, self.partial = engine, seq, partial
        prompt = seq.prompt_ids
        self.rows = partial.rows if partial is not None else [engine.new_row(seq)]
        if partial is None:
            shared, done, kv = engine.cached_start(seq)
            offset = shared.length if shared is not None else 0
            config = engine.model.config
            cache = kv_cache.with_past(config, [kv], done - offset) if done > offset else kv_cache.new_cache(config)
            for layer in cache.layers:  # room for the whole prompt at once, not a copy per chunk
                layer.reserve = len(prompt) - offset + spare_columns([seq.params.max_tokens])
        else:
            shared, cache = partial.shared, partial.cache
            offset = shared.length if shared is not None else 0
            done = offset + partial.mask.shape[1]
        self.end = end = min(len(prompt), done + budget)
        self.offset = offset
        device = engine.device
        self.block = ragged.Block(cache, torch.tensor([prompt[done:end]], dtype=torch.long, device=device),
                                  torch.ones((1, end - offset), dtype=torch.long, device=device),
                                  torch.arange(done, end, device=device)[None], shared)
        self.blocks = [self.block]

    def finish(self, logits: torch.Tensor, every: bool) -> PromptsDone:
        engine, seq, block, end, offset = self.engine, self.seq, self.block, self.end, self.offset
        prompt, shared, cache = seq.prompt_ids, block.shared, block.cache
        if engine.prefix_cache is not None:  # blocks complete so far: a prompt arriving now reuses them
            engine.prefix_cache.insert(prompt, end, lambda a, b: shared.kv[:, :, :, a:b] if b <= offset
                                       else kv_cache.row_kv(cache, 0, a - offset, b - offset))
        complete = end == len(prompt)
        last = logits[ragged.last_columns(self.blocks)] if every else logits
        sampled = sample(last, [r.sampler for r in self.rows]) if complete else [RowOutput(computed=end)]
        row = self.rows[0]
        if self.partial is None:
            row.claim = engine.claim(seq)
        tokens = sampled[0].tokens
        row.feed = tokens if len(tokens) > 1 else None
        row = HFBatch(
            rows=self.rows, cache=cache, mask=block.mask,
            positions=torch.tensor([end], device=engine.device),
            ends=row_ends([(len(prompt), seq.params.max_tokens)], engine.device),
            # No token to feed yet while the prompt is incomplete: its row is not decoded.
            last=torch.tensor([tokens[-1] if complete else 0], dtype=torch.long, device=engine.device),
            shared=shared,
        )
        if complete:
            return PromptsDone(sampled, engine.buckets([row]), {})
        return PromptsDone(sampled, None, {seq.id: row})


def prompt_work(engine: PromptRunner, seqs: list[RowRequest], num_scheduled: list[int],
                partial: dict[str, HFBatch]) -> tuple[WholePrompts | PromptChunk, dict[str, HFBatch]]:
    """The prompt tokens ``num_scheduled`` asks of ``seqs``: whole prompts, or a long prompt
    alone, a chunk at a time; and the rows of ``partial`` this step does not continue."""
    seq = seqs[0]
    if len(seqs) == 1 and (seq.id in partial or num_scheduled[0] < len(seq.prompt_ids)):
        rest = {i: r for i, r in partial.items() if i != seq.id}
        return PromptChunk(engine, seq, partial.get(seq.id), num_scheduled[0]), rest
    return WholePrompts(engine, seqs), partial
