"""What bounds one stream: the weight bytes a decode step reads, against the machine's read speed.

One stream (one row a step) reads every weight it multiplies once a token, so its tokens/s is
bounded by (read bandwidth) / (bytes a token reads). Issue 58 asks for that share printed beside
every one-stream ratio: a ratio near 1.0 between two servers reading the same bytes at ~90 % of
the bandwidth says neither can go much faster, not that one is behind.

- ``read_bandwidth_gbs(threads)``: the best of a few ``torch.sum`` over a 2 GiB float32 tensor at
  that thread count (a streaming read, as a decode GEMV is).
- ``bytes_per_token(gguf, form)``: the bytes of the tensors one token reads, from a GGUF's tensor
  list: every tensor but the input embedding (a token reads one row of it), which the output head
  reads whole where the file has no ``output.weight`` (tied). ``form`` None takes the file's own
  bytes (llama.cpp serving it); ``"int4"``/``"int8"`` our formats' (q4_0's and q8_0's: 4.5 and 8.5
  bits a weight, float32 norms and biases) over the same shapes.
"""

from __future__ import annotations

import time
from pathlib import Path

# Bytes a weight in our formats: groups of 32 with a float16 scale (cpu/int4_linear, int8_linear).
OUR_BYTES = {"int4": 18 / 32, "int8": 34 / 32, "bf16": 2.0, "f32": 4.0}


def read_bandwidth_gbs(threads: int, gib: float = 2.0, repeats: int = 5) -> float:
    """The machine's streaming read speed at ``threads`` threads, GB/s (best of ``repeats``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t)
        return x.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(before)


def bytes_per_token(gguf: Path, form: str | None = None) -> int:
    """The weight bytes one decode token reads (module docstring), in the file's own types
    (``form`` None) or in one of ``OUR_BYTES``' forms."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(gguf)).tensors
    names = {t.name for t in tensors}
    total = 0.0
    for t in tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        if form is None:
            total += int(t.n_bytes)
        else:
            matrix = len([d for d in t.shape if d > 1]) >= 2
            total += int(t.n_elements) * (OUR_BYTES[form] if matrix else 4.0)
    return int(total)


def share(tok_s: float | None, per_token: int | None, bandwidth_gbs: float) -> float | None:
    """What fraction of the read bandwidth ``tok_s`` tokens a second of ``per_token`` bytes is."""
    if not tok_s or not per_token or not bandwidth_gbs:
        return None
    return tok_s * per_token / 1e9 / bandwidth_gbs
