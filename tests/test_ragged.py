"""The ragged forward's attention pieces against PyTorch's own SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from jupyter_infer.engine import ragged


def _reference(query, keys, values, mask, shared_keys, shared_values, scale):
    """SDPA over the prefix copied into every row, then the row's own columns."""
    rows = query.shape[0]
    k = torch.cat([shared_keys.expand(rows, -1, -1, -1), keys], dim=2)
    v = torch.cat([shared_values.expand(rows, -1, -1, -1), values], dim=2)
    seen = torch.ones((rows, 1, query.shape[2], shared_keys.shape[2]), dtype=torch.bool)
    full = torch.cat([seen, mask.expand(rows, -1, query.shape[2], -1)], dim=-1)
    return scaled_dot_product_attention(query, k, v, attn_mask=full, scale=scale, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 5, ragged.QUERY_TILE + 37])
def test_attention_past_a_shared_prefix_is_sdpa_over_the_prefix_copied_per_row(dtype, width: int) -> None:
    """Grouped-query heads (8 over 2), left-padded rows, new columns causal, several tiles."""
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, prefix, past = 3, 8, 2, 16, 40, 7
    columns = past + width
    query = torch.randn(rows, heads, width, dim, dtype=dtype)
    keys, values = (torch.randn(rows, kv_heads, columns, dim, dtype=dtype) for _ in range(2))
    shared_keys, shared_values = (torch.randn(1, kv_heads, prefix, dim, dtype=dtype) for _ in range(2))
    own = torch.ones((rows, columns), dtype=torch.long)
    own[1, :3] = 0  # left padding
    own[2, :past] = 0  # no cached columns of its own: only the prefix and its new tokens
    mask = ragged._attention_mask(own, width)
    got = ragged._attend_past_shared(query, keys, values, mask, shared_keys, shared_values, dim**-0.5)
    want_mask = own.bool()[:, None, None, :] & torch.ones((width, columns), dtype=torch.bool).tril(past)[None, None]
    want = _reference(query.float(), keys.float(), values.float(), want_mask, shared_keys.float(),
                      shared_values.float(), dim**-0.5)
    assert got.shape == (rows, width, heads, dim) and got.dtype == dtype
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got.float(), want, **tolerance)


def test_models_needing_what_block_attention_lacks_keep_their_own_attention() -> None:
    for config in ({"attn_logit_softcapping": 50.0}, {"v_head_dim": 128}, {"sliding_window": 4096}):
        assert ragged.install(SimpleNamespace(config=SimpleNamespace(**config))) is False
