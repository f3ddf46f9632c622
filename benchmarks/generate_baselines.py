"""The contenders without a scheduler: ``model.generate`` one request at a time, and one padded
``generate`` for the whole burst (static batching)."""

from __future__ import annotations

import time
from typing import Any

import torch

from jupyter_infer.commands.bench.contenders import Contender, Run
from jupyter_infer.commands.bench.workloads import Workload
from jupyter_infer.engine.hf.batch import left_pad_rows


class _Clock:
    """A ``generate`` streamer that only notes when tokens come out (its first put is the prompt)."""

    def __init__(self) -> None:
        self.puts: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(time.perf_counter())

    def end(self) -> None:
        pass

    @property
    def first_token(self) -> float | None:
        return self.puts[1] if len(self.puts) > 1 else None


def _generate(model: Any, rows: list[list[int]], new_tokens: int, pad_id: int) -> tuple[torch.Tensor, _Clock]:
    """One ``model.generate`` call over left-padded ``rows``, greedy, exactly ``new_tokens``."""
    ids, mask = left_pad_rows(rows, pad_id)
    clock = _Clock()
    out = model.generate(
        input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=pad_id, streamer=clock,
    )
    return out[:, ids.shape[1]:], clock


class Sequential(Contender):
    """The naive server: ``model.generate`` for one request at a time, in arrival order."""

    name, label, closed_only = "sequential", "sequential generate", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def warmup(self, workload: Workload) -> None:
        self.run(Workload(workload.name, "warm-up", workload.arrivals[:2]))

    def run(self, workload: Workload) -> Run:
        start = time.perf_counter()
        ttft, latency, tokens = [], [], 0
        for arrival in workload.arrivals:
            out, clock = _generate(self.engine.model, [self.engine.text.tokenize(arrival.prompt)],
                                   arrival.max_tokens, self.engine.pad_token_id)
            done = time.perf_counter()
            tokens += out.shape[1]
            ttft.append((clock.first_token - start) * 1000)
            latency.append((done - start) * 1000)
        return Run(time.perf_counter() - start, tokens, ttft, latency)


class StaticBatch(Contender):
    """Static batching: one padded ``model.generate`` call for the whole burst.

    Every row runs to the longest output; only the tokens each request asked for count.
    """

    name, label, closed_only = "static", "static batch (padded generate)", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run(self, workload: Workload) -> Run:
        rows = [self.engine.text.tokenize(a.prompt) for a in workload.arrivals]
        longest = max(a.max_tokens for a in workload.arrivals)
        start = time.perf_counter()
        out, clock = _generate(self.engine.model, rows, longest, self.engine.pad_token_id)
        done = time.perf_counter()
        n = len(rows)
        return Run(
            done - start, workload.total_tokens,
            [(clock.first_token - start) * 1000] * n, [(done - start) * 1000] * n,
            {"padded_tokens": int(out.numel())},
        )
