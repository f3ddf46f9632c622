"""A quantized model's input embedding in q8_0's form (cpu/int8_embedding.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from jupyter_infer.cpu import kernels
from jupyter_infer.cpu.int8_embedding import Q8Embedding, quantize_input_embedding
from jupyter_infer.formats.hf_load import load_causal_lm, parameter_count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lookup_is_the_table_within_half_a_step_of_its_group(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    table = torch.randn(300, 96).to(dtype)
    table[7] = 0  # a row of zeros stays zeros
    q = Q8Embedding.of(table)
    ids = torch.tensor([[0, 7, 299], [5, 5, 1]])
    got = q(ids)
    assert got.shape == (2, 3, 96) and got.dtype == dtype
    assert torch.equal(got[0, 1], torch.zeros(96, dtype=dtype))
    err = (got.float() - table[ids].float()).reshape(2, 3, 3, 32).abs()
    step = q.scales[ids].float().unsqueeze(-1)  # the group's scale: max |w| / 127, as float16
    slack = 0.0 if dtype == torch.float32 else 2 ** -8 * table[ids].float().abs().reshape(2, 3, 3, 32)
    assert (err <= 0.5 * step * (1 + 1e-3) + slack).all()
    assert q.packed.dtype == torch.int8 and q.packed.numel() + 2 * q.scales.numel() < table.numel() * 2


def test_only_a_plain_embedding_no_head_still_reads_is_replaced() -> None:
    class Scaled(nn.Embedding):  # Gemma's kind: a lookup is not the table's row
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return super().forward(ids) * 2.0

    assert not Q8Embedding.fits(Scaled(10, 64)) and not Q8Embedding.fits(nn.Embedding(10, 48))
    assert Q8Embedding.fits(nn.Embedding(10, 64))

    class Tied(nn.Module):  # a float head sharing the table: quantizing would free nothing
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 64), nn.Linear(64, 10, bias=False)
            self.head.weight = self.embed.weight

        def get_input_embeddings(self) -> nn.Module:
            return self.embed

        def get_output_embeddings(self) -> nn.Module:
            return self.head

    tied = Tied()
    assert quantize_input_embedding(tied) is False and type(tied.embed) is nn.Embedding


@pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))
@pytest.mark.parametrize("quantize", ["int4", "int8", "none"])
def test_a_quantized_model_holds_its_embedding_in_int8(llama_model_dir: Path, quantize: str) -> None:
    f32 = AutoModelForCausalLM.from_pretrained(llama_model_dir, dtype=torch.float32).eval()
    lm, _, load = load_causal_lm(str(llama_model_dir), dtype=torch.float32, device="cpu",
                                 local_files_only=True, quantize=quantize, prepack=True)
    embedding = lm.get_input_embeddings()
    assert isinstance(embedding, Q8Embedding) == (quantize != "none")  # float32 stays exact
    assert parameter_count(lm) == sum(p.numel() for p in f32.parameters())  # the checkpoint's count
    if quantize != "none":
        table = f32.get_input_embeddings().weight
        assert load.weight_bytes < sum(p.numel() * 4 for p in f32.parameters()) - table.numel() * 3
        ids = torch.arange(table.shape[0])
        torch.testing.assert_close(embedding(ids), table.detach(), atol=table.abs().max().item() / 127, rtol=0)


def test_a_meta_built_model_reads_its_table_a_chunk_of_rows_at_a_time() -> None:
    # The streamed loader's way (hf_load): the float table, a real vocabulary's largest tensor,
    # is never whole in memory; what it builds is what the whole table would give.
    torch.manual_seed(2)
    table = torch.randn(2500, 64)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            with torch.device("meta"):
                self.embed = nn.Embedding(2500, 64)

        def get_input_embeddings(self) -> nn.Module:
            return self.embed

        def set_input_embeddings(self, module: nn.Module) -> None:
            self.embed = module

        def get_output_embeddings(self) -> None:
            return None

    asked: list[tuple[str, int, int]] = []

    def rows(name: str, first: int, stop: int) -> torch.Tensor:
        asked.append((name, first, stop))
        return table[first:stop].clone()

    model = Model()
    assert quantize_input_embedding(model, rows) is True
    assert {name for name, _, _ in asked} == {"embed.weight"} and max(b - a for _, a, b in asked) < 2500
    assert [a for _, a, _ in asked] == sorted(a for _, a, _ in asked) and asked[-1][2] == 2500
    whole = Q8Embedding.of(table)
    assert torch.equal(model.embed.packed, whole.packed) and torch.equal(model.embed.scales, whole.scales)
