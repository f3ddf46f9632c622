"""A model the user names that cannot be found is refused in one line that names it and the
way out, at once (no minute of Hub retries), and never answered by a stand-in."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jupyter_infer.formats.model_source import ModelNotFound, locate

WAY_OUT = "jupyter infer make-model"


def _unreachable() -> bool:
    return False


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "no-such-model", "No model at {}: nothing is there"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "{} is not a model folder (it has no config.json)"),
    (lambda d: (d / "notes.txt").write_text("hi") and d / "notes.txt", "{} is a file but not a GGUF model"),
    (lambda d: d / "missing.gguf", "No model at {}"),
])
def test_a_path_that_is_no_model_is_named_with_the_way_out(tmp_path: Path, make, says: str) -> None:
    path = str(make(tmp_path))
    with pytest.raises(ModelNotFound) as err:
        locate(path, hub_reachable=_unreachable)
    message = str(err.value)
    assert message.startswith(says.format(path)) and WAY_OUT in message and "\n" not in message


def test_a_folder_of_gguf_files_names_the_file_to_give(tmp_path: Path) -> None:
    (tmp_path / "qwen-q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound, match=r"name the file, e.g. .*qwen-q4_0.gguf"):
        locate(str(tmp_path), hub_reachable=_unreachable)


def test_a_hub_id_not_cached_with_the_hub_unreachable_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    started = time.monotonic()
    with pytest.raises(ModelNotFound, match=r"^nobody/no-such-model is not under InferApp.model_dirs nor in the Hugging Face cache, and the Hub "
                                            r"cannot be reached.*hf download nobody/no-such-model"):
        locate("nobody/no-such-model", hub_reachable=_unreachable)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="switched off here"):
        locate("nobody/no-such-model")
    assert time.monotonic() - started < 5


def test_what_a_model_can_be_is_found(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert locate(str(tiny_model_dir)).kind == "folder"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert locate(str(gguf)) == locate(str(gguf)).__class__(str(gguf), str(gguf), "gguf", True)
    reachable = locate("nobody/some-model", hub_reachable=lambda: True)
    assert (reachable.kind, reachable.local_files_only) == ("hub", False)
    with pytest.raises(ModelNotFound, match="neither a local path nor a Hugging Face model id"):
        locate("what is this?", hub_reachable=_unreachable)
