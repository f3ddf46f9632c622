"""A real vocabulary's tables (the input embedding and the output head: Qwen2.5-0.5B's are
151,936 x 896, 545 MB in float32) go into int4/int8 a chunk of rows at a time, from a
safetensors checkpoint or a GGUF file: their float32 copy is never whole in memory, so it does
not set the load's peak, and what is built is what the whole table would give. A tied head in
our int8 or float kernel serves the embedding's lookups (the table held once), and a bfloat16
checkpoint held as float32 keeps an untied table in bfloat16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf_files import write_llama_gguf
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from jupyter_infer.cpu import kernel_linear, kernels
from jupyter_infer.cpu.float_embedding import BF16Embedding, TiedFloatEmbedding
from jupyter_infer.cpu.int4_linear import Int4Linear
from jupyter_infer.cpu.int8_embedding import Q8Embedding, TiedQ8Embedding
from jupyter_infer.cpu.int8_linear import Q8Linear
from jupyter_infer.formats import gguf_load, hf_load
from jupyter_infer.formats.hf_load import load_causal_lm

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))
CHUNK = 64  # rows a chunk here: the tiny model's 2k vocabulary is then ~30 chunks


@pytest.fixture(scope="module")
def tied_dir(llama_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-tiny with its output head tied to its embedding (Qwen2.5's and Llama-3.2's way):
    the checkpoint holds the table once."""
    out = tmp_path_factory.mktemp("tied")
    for f in llama_model_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(str(llama_model_dir / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_linear, "CHUNK_ROWS", CHUNK)


def _load(model: Path, quantize: str) -> torch.nn.Module:
    return load_causal_lm(str(model), dtype=torch.float32, device="cpu", local_files_only=True,
                          quantize=quantize, prepack=True)[0]


def _assert_built_from(lm: torch.nn.Module, table: torch.Tensor, head: torch.Tensor, kind: type) -> None:
    """``lm``'s embedding and head are what the whole float tables make."""
    embedding, out = lm.get_input_embeddings(), lm.get_output_embeddings()
    assert isinstance(embedding, Q8Embedding) and type(out) is kind
    # A tied int8 head serves the lookups from its own blocks: the table is held once.
    tied = lm.config.tie_word_embeddings and kind is Q8Linear
    assert isinstance(embedding, TiedQ8Embedding) == tied
    ids = torch.arange(table.shape[0]).reshape(-1, 16)
    assert torch.equal(embedding(ids), Q8Embedding.of(table)(ids))
    want = dict(kind.from_weight(head, None).named_buffers())
    for name, buf in out.named_buffers():
        assert torch.equal(buf, want[name]), name


@pytest.mark.parametrize("quantize, kind", [("int4", Int4Linear), ("int8", Q8Linear)])
def test_a_tied_checkpoint_reads_its_table_by_rows_for_the_head_and_the_embedding(
        tied_dir: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch, quantize: str, kind: type) -> None:
    read_whole: list[str] = []
    real = hf_load.read_tensor
    monkeypatch.setattr(hf_load, "read_tensor", lambda path, name: read_whole.append(name) or real(path, name))
    lm = _load(tied_dir, quantize)
    assert "model.embed_tokens.weight" not in read_whole and read_whole  # the norms are read whole
    checkpoint = load_file(str(tied_dir / "model.safetensors"))
    table = checkpoint["model.embed_tokens.weight"]
    _assert_built_from(lm, table, table, kind)
    assert hf_load.parameter_count(lm) == sum(t.numel() for t in checkpoint.values())
    if kind is Q8Linear:  # one storage for the head and the lookups, counted once
        head_bytes = lm.lm_head.packed.untyped_storage()
        assert lm.get_input_embeddings().packed.untyped_storage().data_ptr() == head_bytes.data_ptr()
        assert hf_load.resident_bytes(lm) < hf_load.resident_bytes(lm.model.layers) + 1.1 * head_bytes.nbytes()
    ids = torch.randint(5, 1900, (1, 12), generator=torch.Generator().manual_seed(0))
    f32 = AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float32)
    with torch.no_grad():  # the tied model computes what the checkpoint says, within int rounding
        assert (lm(ids).logits.argmax(-1) == f32(ids).logits.argmax(-1)).float().mean() > 0.7


def _gguf_tables(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    whole: list[str] = []
    real = gguf_load._dequantized
    monkeypatch.setattr(gguf_load, "_dequantized",
                        lambda path, tensor, *a: whole.append(tensor.name) or real(path, tensor, *a))
    return whole


@pytest.mark.parametrize("tied", [False, True])
def test_a_gguf_files_vocabulary_tables_are_read_by_rows_into_int8_and_int4(
        llama_model_dir: Path, tied_dir: Path, tmp_path: Path, small_chunks: None,
        monkeypatch: pytest.MonkeyPatch, tied: bool) -> None:
    # q4_0 linears and a float32 token_embd (as write_llama_gguf writes them), served in int8:
    # the head (its own q4_0 blocks, or the tied table) is read by rows into q8_0's form.
    source = tied_dir if tied else llama_model_dir
    path = write_llama_gguf(source, tmp_path / "model-q4_0.gguf", "Q4_0")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name)  # dequantized whole
    whole = _gguf_tables(monkeypatch)
    lm = _load(path, "int8")
    assert whole and not {"token_embd.weight", "output.weight"} & set(whole)
    _assert_built_from(lm, theirs.get_input_embeddings().weight.detach(),
                       theirs.get_output_embeddings().weight.detach(), Q8Linear)
    # Tied, the file holds the table once (no output.weight): the head was built from its rows.
    assert ("output.weight" in {t.name for t in gguf_load._read_file(path).tensors}) != tied


def test_a_float_model_from_a_gguf_file_keeps_its_table_whole_and_float(
        llama_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_llama_gguf(llama_model_dir, tmp_path / "model-f32.gguf", "F32")
    whole = _gguf_tables(monkeypatch)
    lm = _load(path, "none")
    assert "token_embd.weight" in whole and type(lm.get_input_embeddings()) is torch.nn.Embedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tied", [False, True])
def test_a_float_models_table_is_held_once_and_a_bfloat16_ones_in_bfloat16(
        llama_model_dir: Path, tied_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, tied: bool) -> None:
    # float32 and bfloat16 checkpoints on the CPU are float32 models with our float kernel's
    # linears (bfloat16: hf_load.held_as). A tied head's blocks serve the lookups; an untied
    # bfloat16 model's table stays bfloat16 (read by rows), a float32 one's is the model's own.
    source = tied_dir if tied else llama_model_dir
    read_whole: list[str] = []
    real = hf_load.read_tensor
    monkeypatch.setattr(hf_load, "read_tensor", lambda path, name: read_whole.append(name) or real(path, name))
    lm, _, load = load_causal_lm(str(source), dtype=dtype, device="cpu", local_files_only=True,
                                 quantize="none", prepack=True)
    checkpoint = load_file(str(source / "model.safetensors"))
    table = checkpoint["model.embed_tokens.weight"]
    embedding = lm.get_input_embeddings()
    want = {(True, torch.float32): TiedFloatEmbedding, (True, torch.bfloat16): TiedFloatEmbedding,
            (False, torch.bfloat16): BF16Embedding, (False, torch.float32): torch.nn.Embedding}[(tied, dtype)]
    assert type(embedding) is want
    ids = torch.arange(table.shape[0]).reshape(-1, 8)
    assert torch.equal(embedding(ids), torch.nn.functional.embedding(ids, table.to(dtype).float()))
    assert hf_load.parameter_count(lm) == sum(t.numel() for t in checkpoint.values())
    if tied:  # the head's storage, counted once
        assert embedding.packed.untyped_storage().data_ptr() == lm.lm_head.packed.untyped_storage().data_ptr()
        assert load.weight_bytes < hf_load.resident_bytes(lm.model.layers) + 1.1 * lm.lm_head.packed.nbytes
    if want is BF16Embedding:
        assert "model.embed_tokens.weight" not in read_whole  # by rows, never whole in float32
