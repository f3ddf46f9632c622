"""One forward over several dense blocks of rows: the linears see every row's new tokens at
once, attention runs block by block over each block's own KV.

A ``Block`` is what TGI's batch is (rows left-padded to one width, a dense KV cache, a mask),
and the model sees the blocks' real new tokens packed into one sequence ``[1, tokens]``, as vLLM
runs a ragged batch: padding is left out, each row's positions are its own, the embeddings,
norms, MLPs and projections run once over all of them (the weights are read once a step,
whatever the blocks' lengths), and ``block_attention`` (registered with transformers'
``AttentionInterface``, so the model classes stay transformers' own) puts the packed queries,
keys and values back into their blocks' padded rows, appends each block's keys and values to
its cache and runs SDPA over that block's rows and columns only. A long prompt's row
therefore makes no short row attend over its length, and a row that feeds several tokens (a
grammar's forced run, draft tokens to verify) costs its own tokens, not a column of every row
of its bucket; newcomers' prompts of different lengths cost their own lengths.

A block's rows may also start with one ``SharedPrefix`` (a prompt prefix held once for all of
them): their attention then runs over that prefix's keys and values, read once for the
block, and their own columns after it (``_attend_past_shared``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.utils.import_utils import is_torch_greater_or_equal

from ..kv.shared_prefix import SharedPrefix

ATTENTION = "jupyter_infer_blocks"
# SDPA groups a model's query heads over its key/value heads itself from torch 2.5 on.
_SDPA_GQA = is_torch_greater_or_equal("2.5", accept_dev=True)
# transformers passes a 4-D mask through to attention untouched instead of building one; the
# blocks bring their own masks, so ``forward`` hands it this placeholder.
_OWN_MASKS = torch.ones((1, 1, 1, 1), dtype=torch.bool)


@dataclass
class Block:
    """Rows that share one dense cache: ``ids`` ``[rows, width]`` of new tokens (left-padded),
    ``mask`` ``[rows, cache columns + width]`` after them, ``positions`` ``[rows, width]``;
    ``shared``: the prefix every row starts with, before its cache's columns."""

    cache: DynamicCache
    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    shared: SharedPrefix | None = None

    @property
    def tokens(self) -> int:
        return self.ids.numel()


class Step:
    """A forward's blocks, as ``block_attention`` reads them: where each block's real tokens
    sit in the packed sequence, which of its ``rows × width`` columns they are (``None``:
    all, no padding) and its 4-D mask (built once, used by every layer)."""

    def __init__(self, blocks: Seq[Block]) -> None:
        self.blocks = list(blocks)
        self.starts: list[int] = []
        self.reals: list[torch.Tensor | None] = []
        self.masks: list[torch.Tensor | None] = []
        start = 0
        for block in self.blocks:
            width = block.ids.shape[1]
            real = None  # a one-token column is always real: only wider blocks carry padding
            if width > 1 and not bool((mask := block.mask[:, -width:].bool()).all()):
                real = mask.reshape(-1)
            self.starts.append(start)
            self.reals.append(real)
            start += block.tokens if real is None else int(real.sum())
            self.masks.append(_attention_mask(block.mask, width))
        self.tokens = start

    def packed(self, per_block: Seq[torch.Tensor]) -> torch.Tensor:
        """Each block's ``[rows, width]`` tensor, flattened, its padding left out, concatenated."""
        return torch.cat([t.reshape(-1) if real is None else t.reshape(-1)[real]
                          for t, real in zip(per_block, self.reals, strict=True)])

    def last_columns(self) -> torch.Tensor:
        """The packed index of every row's last column (always real: rows are left-padded)."""
        index = []
        for block, start, real in zip(self.blocks, self.starts, self.reals, strict=True):
            rows, width = block.ids.shape
            if real is None:
                index.append(torch.arange(rows) * width + (start + width - 1))
            else:
                index.append(real.view(rows, width).sum(-1).cpu().cumsum(0) - 1 + start)
        return torch.cat(index).to(self.blocks[0].ids.device)

    def unpacked(self, logits: torch.Tensor) -> torch.Tensor:
        """Packed ``[tokens, vocab]`` back into every block's ``rows × width`` columns (a pad
        column's row is zeros), block after block."""
        parts = []
        for block, start, real in zip(self.blocks, self.starts, self.reals, strict=True):
            if real is None:
                parts.append(logits[start : start + block.tokens])
            else:
                full = logits.new_zeros((block.tokens, logits.shape[-1]))
                full[real] = logits[start : start + int(real.sum())]
                parts.append(full)
        return torch.cat(parts)


def _attention_mask(mask: torch.Tensor, width: int) -> torch.Tensor | None:
    """``[rows, 1, width, columns]``: query j of a row sees the row's real columns up to its own
    (the last ``width`` columns are the new tokens, in order). ``None`` where that is every
    column (one new token, no padding) or plain causal attention (a whole unpadded prompt):
    SDPA's kernels are faster told so than given the mask."""
    columns = mask.shape[1]
    if (width == 1 or width == columns) and bool(mask.all()):
        return None
    real = mask.bool()[:, None, None, :]
    if width == 1:
        return real
    causal = torch.ones((width, columns), dtype=torch.bool, device=mask.device).tril(columns - width)
    return real & causal[None, None]


def forward(model: torch.nn.Module, blocks: Seq[Block], every: bool = False,
            lean: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """The model over ``blocks`` in one forward: the logits of every row's last column, block
    after block (``[rows, vocab]``), or with ``every`` of every column (``[tokens, vocab]``,
    each block's ``rows × width`` flattened; a pad column's logits are zeros).

    Padding is left out of the forward: the linears see only real tokens (a grammar's forced
    run or a prompt's chunk beside one-token rows costs its own tokens, not a column of every
    row of its block), and ``block_attention`` puts each block's back in place. ``lean``: a
    forward of our own for the model's family (``llama_forward.py``), called instead of the
    model's."""
    step = Step(blocks)
    input_ids = step.packed([b.ids for b in blocks])[None]
    position_ids = step.packed([b.positions for b in blocks])[None]
    if lean is not None:
        logits = lean(input_ids, position_ids, step, None if every else step.last_columns())
    else:
        logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=_OWN_MASKS, use_cache=False,
                       logits_to_keep=0 if every else step.last_columns(), jupyter_infer_step=step).logits
    return step.unpacked(logits[0]) if every else logits[0]


def last_columns(blocks: Seq[Block]) -> torch.Tensor:
    """The flattened index of every row's last column, block after block (in every column's
    logits, as ``forward`` gives them with ``every``)."""
    index, start = [], 0
    for block in blocks:
        rows, width = block.ids.shape
        index.append(torch.arange(rows) * width + (start + width - 1))
        start += rows * width
    return torch.cat(index).to(blocks[0].ids.device)


def block_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    jupyter_infer_step: Step | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention block by block over each block's cache (SDPA, transformers' own call); a
    forward that is not ``forward``'s (the model called as usual) is plain SDPA."""
    step = jupyter_infer_step
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    for name in ("softcap", "sliding_window", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:  # install() refuses such models: never silently drop it
            raise NotImplementedError(f"block_attention does not implement {name}")
    heads, dim = query.shape[1], value.shape[3]
    out = None if len(step.blocks) == 1 else query.new_empty((1, step.tokens, heads, dim))
    for block, start, real, mask in zip(step.blocks, step.starts, step.reals, step.masks, strict=True):
        rows, width = block.ids.shape
        span = slice(start, start + (rows * width if real is None else int(real.sum())))
        q, k, v = (_padded(t[0, :, span], real).unflatten(1, (rows, width)).transpose(0, 1)
                   for t in (query, key, value))
        keys, values = block.cache.layers[module.layer_idx].update(k, v)
        if block.shared is None and mask is None and _SDPA_GQA:
            # No mask (every column real): SDPA as transformers' wrapper would call it (grouped
            # heads in the kernel), without the wrapper's work per call: a decode step's case.
            o = F.scaled_dot_product_attention(q, keys, values, scale=scaling, is_causal=width > 1,
                                               enable_gqa=keys.shape[1] != heads).transpose(1, 2)
        elif block.shared is None:
            o, _ = sdpa_attention_forward(module, q, keys, values, mask, dropout=0.0, scaling=scaling)
        else:
            o = _attend_past_shared(q, keys, values, mask, *block.shared.layer(module.layer_idx), scaling)
        if out is None and real is None:  # one block, no padding: its output is the step's
            return o.reshape(1, rows * width, heads, dim), None
        if out is None:
            out = query.new_empty((1, step.tokens, heads, dim))
        o = o.reshape(rows * width, heads, dim)
        out[0, span] = o if real is None else o[real]
    return out, None


def _padded(packed: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """``[heads, real tokens, dim]`` in a block's ``rows × width`` columns (pad columns zero:
    the mask hides them as keys, and their outputs are left out)."""
    if real is None:
        return packed
    full = packed.new_zeros((packed.shape[0], real.numel(), packed.shape[2]))
    full[:, real] = packed
    return full


QUERY_TILE = 128  # query columns a shared-prefix attention scores at once (bounds its memory)


def _attend_past_shared(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                        shared_keys: torch.Tensor, shared_values: torch.Tensor,
                        scaling: float | None) -> torch.Tensor:
    """Attention over a shared prefix (``[1, kv heads, P, dim]``, every row sees all of it) and
    each row's own columns (``[rows, kv heads, W, dim]`` under ``mask``), without copying the
    prefix per row: one softmax over both parts' scores, in float32 as SDPA keeps them, a tile
    of ``QUERY_TILE`` query columns at a time. Returns ``[rows, width, heads, dim]``."""
    width, columns = query.shape[2], keys.shape[2]
    if mask is None and width > 1:  # a whole unpadded prompt after the prefix: causal
        mask = torch.ones((width, columns), dtype=torch.bool, device=query.device).tril(columns - width)[None, None]
    if width > QUERY_TILE:
        return torch.cat([
            _attend_tile(query[:, :, i : i + QUERY_TILE], keys, values,
                         None if mask is None else mask[:, :, i : i + QUERY_TILE], shared_keys, shared_values, scaling)
            for i in range(0, width, QUERY_TILE)], dim=1)
    return _attend_tile(query, keys, values, mask, shared_keys, shared_values, scaling)


def _attend_tile(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                 shared_keys: torch.Tensor, shared_values: torch.Tensor, scaling: float | None) -> torch.Tensor:
    rows, heads, width, dim = query.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    # Grouped-query heads side by side on the query axis: [rows, kv heads, groups * width, dim].
    q = query.reshape(rows, kv_heads, groups * width, dim).float()
    prefix = torch.matmul(q, shared_keys.float().transpose(-1, -2))  # the prefix broadcast over the rows
    own = torch.matmul(q, keys.float().transpose(-1, -2))
    if mask is not None:
        own = own.masked_fill(~mask.repeat(1, 1, groups, 1), float("-inf"))
    weights = torch.softmax(torch.cat([prefix, own], dim=-1) * scale, dim=-1)
    split = shared_keys.shape[2]
    out = torch.matmul(weights[..., :split], shared_values.float()) + torch.matmul(weights[..., split:], values.float())
    return out.to(query.dtype).reshape(rows, heads, width, -1).transpose(1, 2)


# Attention features ``block_attention`` does not implement: a model that needs one keeps a
# forward per bucket through its own attention (``install`` refuses it).
_UNSUPPORTED = ("attn_logit_softcapping", "v_head_dim", "sliding_window", "use_sliding_window")


def install(model: torch.nn.Module) -> bool:
    """Have ``model``'s attention layers call ``block_attention`` (registered with
    transformers' ``AttentionInterface``); ``False`` where the model class cannot switch (it
    does not call attention through that interface, or needs what ``block_attention`` lacks:
    logit soft-capping, a sliding window, value heads of another size). Called as usual, the
    model builds SDPA's masks and runs SDPA."""
    config = model.config
    if any(getattr(config, name, None) for name in _UNSUPPORTED):
        return False
    AttentionInterface.register(ATTENTION, block_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    before = config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    if config._attn_implementation == ATTENTION and _reaches_block_attention(model):
        return True
    model.set_attn_implementation(before)
    return False


def _reaches_block_attention(model: torch.nn.Module) -> bool:
    """Whether a forward's step reaches ``block_attention``: a model whose layers do not pass
    their keyword arguments on to the attention call (Falcon's) would run plain SDPA and never
    fill the blocks' caches. One token, once, at load."""
    from ..kv.kv_cache import holds_kv, new_cache

    cache = new_cache(model.config)
    device = next(model.parameters()).device
    one = torch.zeros((1, 1), dtype=torch.long, device=device)
    try:
        with torch.inference_mode():
            forward(model, [Block(cache, one, torch.ones_like(one), one)])
    except Exception:  # noqa: BLE001 - a model the probe cannot run is one ragged steps cannot either
        return False
    return all(getattr(layer, "keys", None) is not None for layer in cache.layers if holds_kv(layer))
