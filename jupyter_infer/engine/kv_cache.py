"""The KV cache of a running batch, as TGI's ``CausalLMBatch`` treats it: rows can join
(``merge``: left-pad both caches to one length, concatenate on the batch axis) and leave
(``select_rows``: keep some rows, drop leading columns only padding uses).

``GrowingLayer`` keeps keys and values in a buffer with spare room at the end, so a decode
step writes one column in place. transformers' ``DynamicLayer`` concatenates the whole cache
every step instead, which cost a quarter of a GPT-2-small decode step at batch 16 on CPU.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 64  # room added whenever the buffer is full: one reallocation per 64 steps


class GrowingLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        needed = length + key_states.shape[-2]
        buf = self._key_buf
        if buf is None or buf.shape[-2] < needed or buf.shape[0] != key_states.shape[0]:
            self._reallocate(key_states, value_states, length, needed + SPARE_COLUMNS)
        self._key_buf[:, :, length:needed] = key_states
        self._value_buf[:, :, length:needed] = value_states
        self.keys = self._key_buf[:, :, :needed]
        self.values = self._value_buf[:, :, :needed]
        return self.keys, self.values

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Set new contents (after rows joined or left); the next update re-buffers them."""
        self.keys, self.values = keys, values
        self._key_buf = self._value_buf = None

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        def grow(old: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            shape = list(like.shape)
            shape[-2] = capacity
            buf = like.new_zeros(shape)
            if length:
                buf[:, :, :length] = old
            return buf

        self._key_buf = grow(self.keys, key_states)
        self._value_buf = grow(self.values, value_states)


def new_cache(config) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are ``GrowingLayer``s."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


def reusable(config) -> bool:
    """Whether rows of this model's cache can start from stored KV (prefix caching, chunked
    prefill): every layer a full-attention ``GrowingLayer`` (no sliding window to respect)."""
    layers = new_cache(config).layers
    return bool(layers) and all(isinstance(layer, GrowingLayer) for layer in layers)


def with_past(config, pasts: list[torch.Tensor | None], width: int) -> DynamicCache:
    """A cache whose rows start with the given KV (``[layers, 2, heads, length, dim]`` each),
    left-padded to ``width`` columns; a row without one is all padding."""
    first = next(p for p in pasts if p is not None)
    layers, _, heads, _, dim = first.shape
    if len(pasts) == 1 and first.shape[3] == width:
        full = first[:, :, None]
    else:
        full = first.new_zeros((layers, 2, len(pasts), heads, width, dim))
        for row, past in enumerate(pasts):
            if past is not None:
                full[:, :, row, :, width - past.shape[3] :] = past
    cache = new_cache(config)
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(full[i, 0], full[i, 1])
        _set(layer, full[i, 0], full[i, 1])
    return cache


def row_kv(cache: DynamicCache, row: int, start: int, end: int) -> torch.Tensor:
    """Keys and values of columns ``start..end-1`` of one row, every layer, as one new tensor:
    ``[layers, 2, heads, end - start, dim]`` (what a prefix-cache block holds)."""
    return torch.stack([
        torch.stack((layer.keys[row, :, start:end], layer.values[row, :, start:end])) for layer in cache.layers
    ])


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _set(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    if isinstance(layer, GrowingLayer):
        layer.replace(keys, values)
    else:
        layer.keys, layer.values = keys, values


def merge(running: DynamicCache, newcomers: DynamicCache, width: int) -> DynamicCache:
    """Rows of ``newcomers`` after those of ``running``, both left-padded to ``width``."""
    for old, new in zip(running.layers, newcomers.layers, strict=True):
        _set(
            old,
            torch.cat([left_pad(old.keys, width, 2), left_pad(new.keys, width, 2)]),
            torch.cat([left_pad(old.values, width, 2), left_pad(new.values, width, 2)]),
        )
    return running


def select_rows(cache: DynamicCache, index: torch.Tensor, start: int) -> None:
    """Keep the rows in ``index`` and the columns from ``start`` on."""
    for layer in cache.layers:
        _set(layer, layer.keys[index, :, start:], layer.values[index, :, start:])
