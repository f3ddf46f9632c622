"""Train a small causal LM here, in minutes, on local text: weights with real structure, for
measuring what random weights cannot show (how often guesses land on a model's answers when
they are not a random model's loops; a draft model that agrees with its model for a reason).

``jupyter infer make-model DIR --size tiny --train 180`` trains the "tiny" shape (GPT-2, 2
layers, width 128) for 180 seconds on Python's standard library (code: indentation, keywords
and names that repeat), with a byte-level BPE tokenizer trained on the same text. The result
loads like any checkpoint. ``checkpoints`` saves the model as it was after that many steps
too (a weaker model with the same tokenizer: a draft model to measure against the final one).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from .model_builder import MARKER_FILE, SIZES, _build_model, _max_positions, _train_tokenizer

TEXT_BYTES = 8 * 2**20  # how much of the text to read: enough for minutes of a small model
SEQ_LEN = 128  # tokens a training sequence holds
BATCH = 16
LEARNING_RATE = 2e-3  # AdamW, cosine-decayed to a tenth over the training time


def default_texts() -> list[pathlib.Path]:
    """Python's standard library sources: local on every machine this runs on."""
    return [pathlib.Path(sysconfig.get_paths()["stdlib"])]


def read_text(paths: Iterable[str | os.PathLike], limit: int = TEXT_BYTES) -> str:
    """The text of ``paths`` (files, or folders' ``.py``/``.md``/``.txt`` files, sorted, test
    suites left out: their data is not text), up to ``limit`` bytes."""
    files: list[pathlib.Path] = []
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in {".py", ".md", ".txt"} and p.is_file()
                            and not {"test", "tests", "site-packages"} & set(p.relative_to(path).parts))
        elif path.is_file():
            files.append(path)
    out, size = [], 0
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(text)
        size += len(text)
        if size >= limit:
            break
    if not out:
        raise ValueError(f"no text to train on in {', '.join(map(str, paths))}")
    return "".join(out)[:limit]


def train_model(directory: str | os.PathLike, size: str = "tiny", seconds: float = 180.0,
                texts: Sequence[str | os.PathLike] | None = None, seed: int = 0, max_steps: int | None = None,
                checkpoints: Sequence[int] = (), log: Callable[[str], None] = print) -> pathlib.Path:
    """Train a ``size`` model for ``seconds`` (or ``max_steps`` steps, if fewer) on ``texts``
    (default: Python's standard library) and save it in ``directory``; ``checkpoints``: also
    save it as it was after those steps, in ``directory/after-<n>-steps``."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; expected one of {SIZES}")
    if seconds <= 0 or (max_steps is not None and max_steps < 1):
        raise ValueError(f"training needs some time and steps; got {seconds} s, {max_steps} steps")
    target = pathlib.Path(directory)
    text = read_text(texts or default_texts())
    lines = text.splitlines(keepends=True)
    tokenizer = _train_tokenizer(4000, _max_positions(size), lines)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if len(ids) < 4 * SEQ_LEN:
        raise ValueError(f"{len(ids)} tokens of text are too few to train on (at least {4 * SEQ_LEN})")
    log(f"training {size!r} for {seconds:.0f} s on {len(text) / 2**20:.1f} MB of text ({len(ids):,} tokens)")
    model = _build_model(size, tokenizer, seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    start, steps, loss_avg = time.perf_counter(), 0, None
    pending = sorted(checkpoints)
    while (elapsed := time.perf_counter() - start) < seconds and (max_steps is None or steps < max_steps):
        done = max(elapsed / seconds, steps / max_steps if max_steps else 0.0)
        for group in optimizer.param_groups:  # cosine decay over the time (or steps) given
            group["lr"] = LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
        at = torch.randint(0, len(ids) - SEQ_LEN - 1, (BATCH,), generator=generator)
        batch = torch.stack([ids[i : i + SEQ_LEN] for i in at.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
        value = float(loss.detach())
        loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
        if steps % 200 == 0:
            log(f"  {elapsed:6.0f} s  step {steps:6d}  loss {loss_avg:.3f}")
        while pending and steps >= pending[0]:
            _save(model, tokenizer, target / f"after-{pending.pop(0)}-steps", size, elapsed, steps, loss_avg)
    _save(model, tokenizer, target, size, time.perf_counter() - start, steps, loss_avg)
    log(f"trained: {steps} steps, loss {loss_avg:.3f}" if loss_avg is not None else "trained: no step ran")
    return target


def _save(model, tokenizer, target: pathlib.Path, size: str, seconds: float, steps: int, loss: float | None) -> None:
    model.eval()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / MARKER_FILE).write_text(json.dumps({"builder": "jupyter_infer", "size": size, "trained_s": round(seconds),
                                                  "steps": steps, "loss": loss}, indent=2) + "\n")
    model.train()
