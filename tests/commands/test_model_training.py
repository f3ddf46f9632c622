"""`make-model --train`: a small model trained here for seconds learns its text, loads like any
checkpoint, and its earlier checkpoint shares its tokenizer (a draft model for it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from jupyter_infer.commands.model_training import train_model
from jupyter_infer.engine.hf import HFEngine

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"


def test_a_model_trained_for_seconds_learns_its_text_and_drafts_for_itself(tmp_path: Path) -> None:
    text = tmp_path / "code.py"
    text.write_text(CODE * 400)
    said: list[str] = []
    # By steps, not seconds: a busy machine trains as far, only slower.
    path = train_model(tmp_path / "trained", "tiny", seconds=600, max_steps=150, texts=[text], checkpoints=[20],
                       log=said.append)
    marker = json.loads((path / "jupyter_infer_model.json").read_text())
    vocab = HFEngine(str(path), dtype="float32", num_threads=1).vocab_size
    assert marker["steps"] == 150 and marker["loss"] < 0.5 * math.log(vocab)  # far below a random model's
    # It quotes what it learnt: greedy text after a function's head is its body.
    engine = HFEngine(str(path), dtype="float32", num_threads=1, draft_model=str(path / "after-20-steps"))
    ids = engine.text.tokenize("def add(a, b):\n")
    out = engine.model.generate(__import__("torch").tensor([ids]), max_new_tokens=8, do_sample=False)
    assert engine.text.detokenize(out[0, len(ids):].tolist()).startswith("    return a")
    assert engine.draft is not None and said[0].startswith("training 'tiny'")
