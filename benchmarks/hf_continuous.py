"""transformers' built-in continuous batching (``ContinuousBatchingManager``), in-process."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from jupyter_infer.commands.bench.contenders import Contender, Run
from jupyter_infer.commands.bench.workloads import Workload
from jupyter_infer.commands.loadgen import Arrival


class TransformersContinuous(Contender):
    """transformers' built-in continuous batching: one ``ContinuousBatchingManager``, kept.

    Its default cache sizing takes most of free memory, so the cache is sized explicitly
    for this workload: small pages, enough blocks for every request's prompt and output.
    The manager lives for the whole benchmark (``keep_for_next_session``), but its generation
    thread runs only during its own runs: an idle manager thread slowed the other
    contenders' ``generate`` by ~12 % in our measurements, which would flatter this one.
    Each run builds a fresh paged cache, so with ``block_sharing`` (its prefix sharing) every
    run starts cold, as ours does.
    """

    name = "hf_cb"

    def __init__(self, model_dir: str, tokenize: Callable[[str], list[int]], dtype: torch.dtype,
                 max_batch_size: int, max_tokens_per_request: int, page_size: int = 32,
                 device: str = "cpu", block_sharing: bool = False) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.label = "transformers continuous batching" + (" + prefix sharing" if block_sharing else "")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        pad = self.model.generation_config.pad_token_id
        blocks = max_batch_size * math.ceil(max_tokens_per_request / page_size) + 8
        self.cache_config = {"page_size": page_size, "num_blocks": blocks,
                             "max_batch_tokens": 1024, "max_requests_per_batch": max_batch_size}
        self._configs = {
            "generation_config": GenerationConfig(
                max_new_tokens=64, do_sample=False, eos_token_id=-1, pad_token_id=0 if pad is None else pad,
            ),
            "continuous_batching_config": ContinuousBatchingConfig(
                **self.cache_config, allow_block_sharing=block_sharing, use_cuda_graph=False,
                use_async_batching=False,
            ),
        }
        self.manager = self.model.init_continuous_batching(**self._configs)
        self.tokenize = tokenize

    def supports(self, workload: Workload) -> bool:
        return workload.late is None

    def _resume(self) -> None:
        """Start the manager's generation thread; return once it can take requests."""
        # After the first session this returns the same, cached manager.
        self.manager = self.model.init_continuous_batching(**self._configs)
        self.manager.batch_processor = None  # the thread builds a fresh one: wait for it
        self.manager.start()
        deadline = time.monotonic() + 60
        while self.manager.batch_processor is None:
            if not self.manager.is_running() or time.monotonic() > deadline:
                raise RuntimeError("transformers' continuous batching manager did not start")
            time.sleep(0.001)

    def _pause(self) -> None:
        self.manager.stop(block=True, timeout=30, keep_for_next_session=True)

    def run(self, workload: Workload) -> Run:
        rows = {id(a): self.tokenize(a.prompt) for a in workload.requests}
        self._resume()
        try:
            return self._run(workload, rows)
        finally:
            self._pause()

    def _run(self, workload: Workload, rows: dict[int, list[int]]) -> Run:
        start = time.perf_counter()
        next_round: dict[str, tuple[list[Arrival], int]] = {}  # request id -> (its chain, next index)

        def add(arrival: Arrival) -> str:
            return self.manager.add_request(rows[id(arrival)], max_new_tokens=arrival.max_tokens,
                                            eos_token_id=-1, record_timestamps=True)

        def feed() -> None:
            for arrival in workload.arrivals:
                delay = start + arrival.at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                add(arrival)

        for chain in workload.chains:
            next_round[add(chain[0])] = (chain, 1)
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        results: dict[str, Any] = {}
        total = len(workload.requests)
        while len(results) < total:
            result = self.manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError("transformers' continuous batching manager stopped answering")
            if result.is_finished():
                if result.error:
                    raise RuntimeError(f"transformers' continuous batching failed: {result.error}")
                results[result.request_id] = result
                chain, index = next_round.pop(result.request_id, (None, 0))
                if chain is not None and index < len(chain):
                    next_round[add(chain[index])] = (chain, index + 1)
        feeder.join()
        end = max(r.lifespan[1] for r in results.values())
        first = min(r.created_time for r in results.values())
        return Run(
            end - min(start, first), sum(len(r.generated_tokens) for r in results.values()),
            [(r.timestamps[0] - r.created_time) * 1000 for r in results.values()],
            [(r.lifespan[1] - r.created_time) * 1000 for r in results.values()],
        )

    def close(self) -> None:
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=10)
        self.model._cached_continuous_batching_manager = None
