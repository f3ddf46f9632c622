"""The KV cache of a running batch, as TGI's ``CausalLMBatch`` treats it: rows can join
(``merge``: left-pad both caches to one length, concatenate on the batch axis) and leave
(``select_rows``: keep some rows, drop leading columns only padding uses).

``GrowingLayer`` keeps keys and values in a buffer with spare room at the end, so a decode
step writes one column in place. transformers' ``DynamicLayer`` concatenates the whole cache
every step instead, which cost a quarter of a GPT-2-small decode step at batch 16 on CPU.
``merge`` and ``select_rows`` write their result straight into such a buffer: one copy of
the cache when rows join or leave, not three (pad, concatenate, re-buffer at the next step).

Hybrid models (Granite 4, Qwen3-Next, LFM2, Falcon-H1) have linear-attention, Mamba or
convolution layers beside attention: transformers keeps their per-row conv and recurrent
states in ``LinearAttentionLayer``s. A state has no columns: rows join by concatenating their
states, leave by selecting them (``_merge_states``, ``_select_states``).
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

try:  # transformers >= 5: the per-row states of linear-attention / Mamba / conv layers
    from transformers.cache_utils import LinearAttentionCacheLayerMixin as _StateLayer
except ImportError:  # pragma: no cover - older transformers keep such states elsewhere
    class _StateLayer:  # type: ignore[no-redef]
        """Nothing is one."""

SPARE_COLUMNS = 64  # room added whenever the buffer is full: one reallocation per 64 steps


class GrowingLayer(DynamicLayer):
    reserve = 0  # columns the next allocation makes room for at least (a chunked prompt's length)
    spare = SPARE_COLUMNS  # room an allocation adds past what is needed (``set_spare``)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        needed = length + key_states.shape[-2]
        self._make_room(key_states, value_states, length, needed)
        self._key_buf[:, :, length:needed] = key_states
        self._value_buf[:, :, length:needed] = value_states
        self.keys = self._key_buf[:, :, :needed]
        self.values = self._value_buf[:, :, :needed]
        return self.keys, self.values

    @property
    def capacity(self) -> int:
        """Columns allocated: the contents' and the spare room after them (``keys`` is a view
        of the first ones)."""
        buf = getattr(self, "_key_buf", None)
        return buf.shape[-2] if buf is not None else self.get_seq_length()

    def room_for_one(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The key and value buffers with room for one more column, and that column: for a
        decode step that writes its key and value there itself (``decode_layers``), then
        calls ``wrote_one``. The layer must hold keys already."""
        length = self.get_seq_length()
        self._make_room(self.keys, self.values, length, length + 1)
        return self._key_buf, self._value_buf, length

    def wrote_one(self, column: int) -> None:
        """``column`` (``room_for_one``'s) now holds a key and value: the contents end there."""
        self.keys = self._key_buf[:, :, : column + 1]
        self.values = self._value_buf[:, :, : column + 1]

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Set new contents (after rows joined or left); the next update re-buffers them."""
        self.keys, self.values = keys, values
        self._key_buf = self._value_buf = None

    def adopt(self, key_buf: torch.Tensor, value_buf: torch.Tensor, length: int) -> None:
        """Take buffers whose first ``length`` columns are the contents; the rest is spare room."""
        self._key_buf, self._value_buf = key_buf, value_buf
        self.keys, self.values = key_buf[:, :, :length], value_buf[:, :, :length]

    def _make_room(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, needed: int) -> None:
        """Buffers for ``needed`` columns of ``key_states``' rows: reallocated (with spare room)
        when they are too small or hold another number of rows."""
        buf = self._key_buf
        if buf is None or buf.shape[-2] < needed or buf.shape[0] != key_states.shape[0]:
            self._reallocate(key_states, value_states, length, max(needed + self.spare, self.reserve))

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        def grow(old: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            shape = list(like.shape)
            shape[-2] = capacity
            buf = like.new_empty(shape)  # columns past the contents are written before being read
            if length:
                buf[:, :, :length] = old
            return buf

        self._key_buf = grow(self.keys, key_states)
        self._value_buf = grow(self.values, value_states)


def new_cache(config) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are ``GrowingLayer``s. A sliding-window
    layer keeps every column too: transformers' own drops those past the window, which a batch
    whose rows are left-padded to one width cannot line up with its mask (a prompt longer than
    the window failed: Gemma 3 1B's is 512 tokens); the mask, built from the config's window,
    hides them."""
    cache = DynamicCache(config=config)
    if _sliding(cache):
        cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer
                        for layer in cache.layers]
    elif cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


def _sliding(cache: DynamicCache) -> bool:
    return any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers)


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


def bytes_held(cache: DynamicCache) -> int:
    """The bytes a cache's keys and values take, spare room included (a ``GrowingLayer``'s
    buffers, not the views of them); a hybrid's recurrent states are ``state_bytes``."""
    total = 0
    for layer in cache.layers:
        if not holds_kv(layer):
            continue
        buffers = (getattr(layer, "_key_buf", None), getattr(layer, "_value_buf", None))
        if buffers[0] is None:
            buffers = (getattr(layer, "keys", None), getattr(layer, "values", None))
        total += sum(t.numel() * t.element_size() for t in buffers if isinstance(t, torch.Tensor))
    return total


def state_bytes(cache: DynamicCache) -> int:
    """The bytes of a hybrid's recurrent states (Mamba, linear attention, short convolutions):
    a fixed size per row, whatever its length."""
    return sum(states[i].numel() * states[i].element_size()
               for layer in cache.layers if isinstance(layer, _StateLayer) for states, i in _states(layer))


def block_shape(config, tokens: int) -> tuple[int, int, int, int, int]:
    """The keys and values of ``tokens`` tokens of one row, every attention layer, as
    ``row_kv`` gives them: ``[layers, 2, kv heads, tokens, head dim]``."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return attention_layers(config), 2, heads, tokens, head_dim


def bytes_per_token(config, dtype: torch.dtype) -> int:
    """One token's keys and values over every attention layer of a model with ``config``."""
    return math.prod(block_shape(config, 1)) * torch.tensor([], dtype=dtype).element_size()


def attention_layers(config) -> int:
    """The layers that keep keys and values per token: a hybrid's recurrent ones (Mamba,
    linear attention, short convolutions) hold a state of fixed size instead; a layer with
    both (Falcon-H1's ``hybrid``) counts. Sliding-window layers count: we keep all columns."""
    types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if not types:
        return config.num_hidden_layers
    return sum(t == "hybrid" or ("attention" in t and "linear" not in t) for t in types)


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


def _buffer(like: torch.Tensor, rows: int, length: int, spare: int) -> torch.Tensor:
    return like.new_empty((rows, like.shape[1], length + spare, like.shape[3]))


def drop_columns(cache: DynamicCache, n: int) -> None:
    """Forget the last ``n`` columns of every row (draft tokens their model rejected); a
    ``GrowingLayer`` keeps its buffer, and writes the next columns over them."""
    for layer in cache.layers:
        length = layer.keys.shape[2] - n
        if isinstance(layer, GrowingLayer) and getattr(layer, "_key_buf", None) is not None:
            layer.keys, layer.values = layer._key_buf[:, :, :length], layer._value_buf[:, :, :length]
        else:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


def set_spare(cache: DynamicCache, spare: int) -> None:
    """The room the cache's next allocations add past what they need: no more than its rows
    can still use (rows near their ``max_tokens`` need few more columns), ``SPARE_COLUMNS``
    at most."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.spare = spare


def _states(layer: _StateLayer) -> list[tuple[dict, int]]:
    """A state layer's initialized states, as (their dict, index) places."""
    return [(states, i) for states, ready in ((layer.conv_states, layer.is_conv_states_initialized),
                                              (layer.recurrent_states, layer.is_recurrent_states_initialized))
            for i, tensor in states.items() if ready[i] and tensor is not None]


def _merge_states(old: _StateLayer, new: _StateLayer, width: int) -> None:
    """``new``'s rows' states after ``old``'s (a state has no columns: nothing to pad)."""
    for (states, i), (other, _) in zip(_states(old), _states(new), strict=True):
        states[i] = torch.cat([states[i], other[i]])
    old.cumulative_length_linear = old.cumulative_length_linear.new_tensor(width)


def _select_states(layer: _StateLayer, index: torch.Tensor, length: int) -> None:
    for states, i in _states(layer):
        states[i] = states[i].index_select(0, index.to(states[i].device))
    layer.cumulative_length_linear = layer.cumulative_length_linear.new_tensor(length)


def holds_state(layer: object) -> bool:
    """Whether a cache layer holds per-row states (Mamba, linear attention, convolution)."""
    return isinstance(layer, _StateLayer)


def holds_kv(layer: object) -> bool:
    """Whether a cache layer holds keys and values (a state-only layer does not)."""
    return not isinstance(layer, _StateLayer) or isinstance(layer, DynamicLayer)


def merge(running: DynamicCache, newcomers: DynamicCache, width: int, spare: int = SPARE_COLUMNS) -> DynamicCache:
    """Rows of ``newcomers`` after those of ``running``, both left-padded to ``width``, with
    ``spare`` columns of room."""
    for old, new in zip(running.layers, newcomers.layers, strict=True):
        if isinstance(old, _StateLayer):
            _merge_states(old, new, width)
        if not holds_kv(old):
            continue
        if not isinstance(old, GrowingLayer):
            _set(old, torch.cat([left_pad(old.keys, width, 2), left_pad(new.keys, width, 2)]),
                 torch.cat([left_pad(old.values, width, 2), left_pad(new.values, width, 2)]))
            continue
        buffers = []
        for a, b in ((old.keys, new.keys), (old.values, new.values)):
            buf = _buffer(a, a.shape[0] + b.shape[0], width, spare)
            for rows, part in ((buf[: a.shape[0]], a), (buf[a.shape[0] :], b)):
                pad = width - part.shape[2]
                rows[:, :, :pad].zero_()  # masked, but must be finite: 0 x NaN would poison attention
                rows[:, :, pad:width] = part
            buffers.append(buf)
        old.adopt(*buffers, width)
        old.spare = spare
    return running


def shallow_copy(cache: DynamicCache) -> DynamicCache:
    """A cache object of its own over the same tensors: ``select_rows`` on it leaves this one be."""
    clone = copy.copy(cache)
    clone.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in clone.layers:
        if isinstance(layer, _StateLayer):  # its states live in dicts: the copy gets its own
            layer.conv_states, layer.recurrent_states = dict(layer.conv_states), dict(layer.recurrent_states)
    return clone


def select_rows(cache: DynamicCache, index: torch.Tensor, start: int, spare: int = SPARE_COLUMNS) -> None:
    """Keep the rows in ``index`` and the columns from ``start`` on (``spare`` columns of room)."""
    length = next((layer.keys.shape[2] for layer in cache.layers if holds_kv(layer)), start) - start
    for layer in cache.layers:
        if isinstance(layer, _StateLayer):
            _select_states(layer, index, length)
        if not holds_kv(layer):
            continue
        if not isinstance(layer, GrowingLayer):
            _set(layer, layer.keys[index, :, start:], layer.values[index, :, start:])
            continue
        length = layer.keys.shape[2] - start
        buffers = []
        for t in (layer.keys, layer.values):
            buf = _buffer(t, len(index), length, spare)
            torch.index_select(t[:, :, start:], 0, index, out=buf[:, :, :length])
            buffers.append(buf)
        layer.adopt(*buffers, length)
        layer.spare = spare
