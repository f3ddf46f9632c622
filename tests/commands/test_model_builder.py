"""Tests for the local random-weight model builder."""

from __future__ import annotations

import argparse
import json
import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jupyter_infer.commands.make_model import add_arguments
from jupyter_infer.commands.model_builder import (
    MARKER_FILE,
    SIZES,
    default_cache_dir,
    ensure_model,
    make_model,
)

# "small" is deliberately absent: ~350 MB of weights is too slow for unit tests.
BUILT_SIZES = ("tiny", "llama-tiny")


@pytest.fixture(params=BUILT_SIZES)
def built(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> pathlib.Path:
    """A freshly built model directory of each cheap size."""
    path = make_model(tmp_path / request.param, size=request.param)
    assert path == tmp_path / request.param
    return path


def test_unknown_size_rejected(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="unknown model size") as info:
        make_model(tmp_path / "x", size="huge")
    assert not (tmp_path / "x").exists()
    # The message lists what to type instead: every size there is.
    for size in SIZES:
        assert repr(size) in str(info.value), size


def test_the_command_line_offers_the_sizes_the_builder_builds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``jupyter infer make-model DIR --size ...`` takes each advertised size, and no other."""
    parser = argparse.ArgumentParser(prog="make-model")
    add_arguments(parser)
    assert set(BUILT_SIZES) < set(SIZES)  # the sizes built here, and "small", are all offered
    for size in SIZES:
        assert parser.parse_args(["d", "--size", size]).size == size
    assert parser.parse_args(["d"]).size == "tiny"
    with pytest.raises(SystemExit):
        parser.parse_args(["d", "--size", "huge"])
    error = capsys.readouterr().err
    assert "--size" in error and "huge" in error
    assert all(size in error for size in SIZES), error


def test_directory_contents(built: pathlib.Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        MARKER_FILE,
    ):
        assert (built / name).is_file(), name
    assert "random" in (built / "README.md").read_text().lower()
    assert "jupyter_infer" in (built / "README.md").read_text()
    marker = json.loads((built / MARKER_FILE).read_text())
    assert marker["size"] == built.name
    assert marker["seed"] == 0
    # No staging directories are left next to the build.
    assert [p.name for p in built.parent.iterdir()] == [built.name]


def test_tiny_config_shape(tmp_path: pathlib.Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(make_model(tmp_path, "tiny"))
    cfg = model.config
    assert cfg.model_type == "gpt2"
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions) == (2, 4, 128, 512)
    assert 1000 <= cfg.vocab_size <= 2000
    assert model.num_parameters() < 5_000_000


def test_llama_tiny_config_shape(tmp_path: pathlib.Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(make_model(tmp_path, "llama-tiny"))
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.hidden_size == 128
    assert cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4
    assert cfg.num_key_value_heads == 2
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.intermediate_size == 256
    assert cfg.max_position_embeddings == 512


def test_special_token_ids_match(built: pathlib.Path) -> None:
    tok = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert tok.eos_token == tok.bos_token == tok.unk_token == "<|endoftext|>"
    assert tok.pad_token_id == tok.eos_token_id
    assert len(tok) == model.config.vocab_size
    for cfg in (model.config, model.generation_config):
        assert cfg.eos_token_id == tok.eos_token_id
        assert cfg.bos_token_id == tok.bos_token_id
        assert cfg.pad_token_id == tok.pad_token_id


@pytest.mark.parametrize(
    "text",
    [
        "Attention is all you need, said the paper in 2017.",
        "  Leading spaces , odd punctuation !?\nand a newline",
        "Unicode outside the corpus: naïve café, 日本語, 🙂",
    ],
)
def test_tokenizer_round_trip(tmp_path: pathlib.Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(make_model(tmp_path, "tiny"))
    ids = tok.encode(text)
    assert ids
    assert tok.decode(ids) == text


def test_chat_template(tmp_path: pathlib.Path) -> None:
    tok = AutoTokenizer.from_pretrained(make_model(tmp_path, "tiny"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a token?"},
    ]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|system|>\nBe brief.\n<|user|>\nWhat is a token?\n<|assistant|>\n"
    no_gen = tok.apply_chat_template(messages, tokenize=False)
    assert not no_gen.endswith("<|assistant|>\n")
    # Role markers are single special tokens.
    assert len(tok.encode("<|assistant|>")) == 1


def test_greedy_generate(built: pathlib.Path) -> None:
    tok = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    inputs = tok("A language model predicts", return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        again = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new_tokens = out[0, prompt_len:]
    assert 0 < new_tokens.numel() <= 8
    assert bool((new_tokens < len(tok)).all())
    assert torch.equal(out, again)  # greedy is deterministic
    # The locally trained tokenizer gives the prompt back exactly, then the continuation.
    assert tok.decode(out[0], skip_special_tokens=True).startswith("A language model predicts")


def test_second_call_does_not_rebuild(built: pathlib.Path) -> None:
    weights = built / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert make_model(built, size=built.name) == built
    assert weights.stat().st_mtime_ns == before


def test_different_seed_rebuilds(tmp_path: pathlib.Path) -> None:
    path = make_model(tmp_path, "tiny", seed=0)
    w0 = AutoModelForCausalLM.from_pretrained(path).lm_head.weight.detach().clone()
    make_model(tmp_path, "tiny", seed=1)
    w1 = AutoModelForCausalLM.from_pretrained(path).lm_head.weight
    assert json.loads((path / MARKER_FILE).read_text())["seed"] == 1
    assert not torch.equal(w0, w1)


def test_same_seed_is_reproducible(tmp_path: pathlib.Path) -> None:
    a = AutoModelForCausalLM.from_pretrained(make_model(tmp_path / "a", "llama-tiny"))
    b = AutoModelForCausalLM.from_pretrained(make_model(tmp_path / "b", "llama-tiny"))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name


def test_build_leaves_global_rng_alone(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    make_model(tmp_path, "tiny", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_incomplete_build_is_redone(tmp_path: pathlib.Path) -> None:
    path = make_model(tmp_path, "tiny")
    (path / "model.safetensors").unlink()
    make_model(path, "tiny")
    assert (path / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(path)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("JUPYTER_INFER_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("JUPYTER_INFER_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "jupyter_infer" / "models"


def test_ensure_model(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("JUPYTER_INFER_HOME", str(tmp_path))
    path = ensure_model("tiny")
    assert path == tmp_path / "models" / "tiny"
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    AutoTokenizer.from_pretrained(path)
