"""Our own ceiling: the raw cost of bare decode steps over the bench's model, with no
scheduling at all, for every batching contender to be measured against."""

from __future__ import annotations

import time
from typing import Any

import torch

from ...engine.hf.batch import left_pad_rows
from .contenders import Contender, Run
from .workloads import Workload


class DecodeCeiling(Contender):
    """The ceiling: the raw cost of decode steps with the KV cache and no scheduling at all.

    Prefills every row (not counted), then times only the bare forward + argmax of each
    decode step, each step running exactly the rows that still want tokens. Tokens per
    second over those steps is what no scheduler on this machine can beat.
    """

    name, label, closed_only = "ceiling", "ceiling (bare decode steps)", True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run(self, workload: Workload) -> Run:
        from transformers import DynamicCache

        model = self.engine.model
        device = model.device
        rows = [self.engine.text.tokenize(a.prompt) for a in workload.arrivals]
        want = torch.tensor([a.max_tokens for a in workload.arrivals])
        ids, mask = (t.to(device) for t in left_pad_rows(rows, self.engine.pad_token_id))
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                        cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
            last = out.logits[:, -1].argmax(-1)
            prefill_s = time.perf_counter() - t0
            cache, positions = out.cache, mask.sum(-1)
            decode_s, tokens, step = 0.0, 0, 1
            alive = torch.arange(len(rows))
            while True:
                keep = (want[alive] > step).nonzero().flatten()
                if len(keep) == 0:
                    break
                if len(keep) < len(alive):  # rows that are done leave, as they would in any good scheduler
                    index = keep.to(device)
                    for layer in cache.layers:
                        layer.keys, layer.values = layer.keys[index], layer.values[index]
                    mask, positions, last, alive = mask[index], positions[index], last[index], alive[keep]
                mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
                t = time.perf_counter()
                out = model(input_ids=last[:, None], attention_mask=mask, position_ids=positions[:, None],
                            cache=cache, use_cache=True)
                last = out.logits[:, -1].argmax(-1)
                decode_s += time.perf_counter() - t
                cache, positions, tokens, step = out.cache, positions + 1, tokens + len(alive), step + 1
        total = time.perf_counter() - t0
        return Run(decode_s, tokens, extra={
            "prefill_s": prefill_s,
            "decode_step_ms": decode_s / max(step - 1, 1) * 1000,
            # The same bare loop counted end to end, prefill included: the practical best.
            "bare_loop_tokens_per_s": workload.total_tokens / total,
        })
