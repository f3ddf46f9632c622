"""The ragged forward's attention pieces against PyTorch's own SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from jupyter_infer.engine.hf import ragged


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


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "llama_model_dir"])
def test_padding_never_reaches_the_linears_and_every_real_column_is_the_models_own(request, model_fixture) -> None:
    """Prompts of 2 to ~15 tokens in one left-padded block: the model runs over their real
    tokens only, and each real column's logits are those of the prompt run alone."""
    from transformers import AutoModelForCausalLM

    from jupyter_infer.engine.hf import HFEngine
    from jupyter_infer.engine.hf.prompt_work import WholePrompts
    from jupyter_infer.values.request import Request, SamplingParams
    from jupyter_infer.values.sequence import Sequence

    model_dir = request.getfixturevalue(model_fixture)
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1)
    prompts = ["KV cache", "What is dynamic batching and why does it help throughput?", "agents plan"]
    seqs = [Sequence(Request(p, SamplingParams(max_tokens=1)), engine.text.tokenize(p)) for p in prompts]
    work = WholePrompts(engine, seqs)
    seen: list[int] = []
    embed = engine.model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    with torch.inference_mode():
        logits = ragged.forward(engine.model, work.blocks, every=True)
    handle.remove()
    real = sum(len(s.prompt_ids) for s in seqs)
    assert seen == [real] and work.blocks[0].tokens > real  # the block is padded, the forward is not
    alone = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    width = work.blocks[0].ids.shape[1]
    for row, seq in enumerate(seqs):
        with torch.inference_mode():
            want = alone(input_ids=torch.tensor([seq.prompt_ids])).logits[0]
        got = logits[row * width : (row + 1) * width][-len(seq.prompt_ids):]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
