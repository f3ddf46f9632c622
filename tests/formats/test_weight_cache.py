"""A second start does not quantize again: our int4/int8 linears are kept on disk, keyed by the
checkpoint's files, the format and the layout, and read back; a changed checkpoint is another
key, and a damaged cache is detected, removed and rebuilt, never served."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from jupyter_infer.cpu import int4_linear
from jupyter_infer.cpu.int4_linear import Int4Linear
from jupyter_infer.cpu.kernels import unavailable
from jupyter_infer.formats.hf_load import load_causal_lm
from jupyter_infer.formats.weight_cache import MARKER, cache_root

pytestmark = pytest.mark.skipif(unavailable() is not None, reason="our CPU kernels do not build here")


def load(folder: Path, quantize: str = "int4") -> tuple[torch.nn.Module, dict]:
    lm, linears, _ = load_causal_lm(str(folder), dtype=torch.float32, device="cpu", local_files_only=True,
                                    quantize=quantize, prepack=True)
    return lm, linears.cache


def weights(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: torch.cat([m.blocks.flatten(), m.scales.view(torch.uint8).flatten()])
            for n, m in lm.named_modules() if isinstance(m, Int4Linear)}


@pytest.fixture
def checkpoint(llama_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_INFER_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    shutil.copytree(llama_model_dir, folder)
    return folder


def test_the_second_load_reads_the_cache_and_quantizes_nothing(checkpoint: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first, cache = load(checkpoint)
    assert cache["hit"] is False and cache["bytes"] > 0
    def no_quantizing(*args: object) -> None:
        raise AssertionError("quantized again")
    monkeypatch.setattr(int4_linear, "quantize", no_quantizing)
    second, cache = load(checkpoint)
    assert cache["hit"] is True
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    x = torch.randn(3, first.config.hidden_size)
    layer = "model.layers.0.self_attn.q_proj"
    assert torch.equal(first.get_submodule(layer)(x), second.get_submodule(layer)(x))


def test_a_changed_checkpoint_is_another_key(checkpoint: Path, tmp_path: Path) -> None:
    _, first = load(checkpoint)
    weights_file = checkpoint / "model.safetensors"
    os.utime(weights_file, ns=(weights_file.stat().st_atime_ns, weights_file.stat().st_mtime_ns + 10**9))
    _, second = load(checkpoint)
    assert second["hit"] is False and second["dir"] != first["dir"]
    # A copy with its times kept (cp -a) is another checkpoint: never served the first one's weights.
    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy, copy_function=shutil.copy2)
    _, third = load(copy)
    assert third["hit"] is False and third["dir"] != second["dir"]


@pytest.mark.parametrize("damage", ["truncate", "no marker", "missing file"])
def test_a_damaged_cache_is_rebuilt_never_served(checkpoint: Path, damage: str) -> None:
    expected, cache = load(checkpoint)
    folder = Path(cache["dir"])
    files = sorted(folder.glob("*.safetensors"))
    if damage == "truncate":
        files[0].write_bytes(files[0].read_bytes()[:100])
    elif damage == "no marker":
        (folder / MARKER).unlink()
    else:
        files[-1].unlink()
    again, cache = load(checkpoint)
    assert cache["hit"] is False  # quantized anew
    a, b = weights(expected), weights(again)
    assert all(torch.equal(a[n], b[n]) for n in a)
    _, cache = load(checkpoint)
    assert cache["hit"] is True and Path(cache["dir"]).parent == cache_root()  # and written whole again
