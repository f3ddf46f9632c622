"""A decode step's layers in one C call (engine/hf/decode_layers.py): taken by the Llama family with
our int4, int8 and float32 linears, and what it computes is the per-layer path's to the bit — left-padded rows, every column
seen, a cache that must grow, q/k/v biases, Qwen3's per-head norms — so answers through the scheduler do not change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_architectures import checkpoint
from test_hf_engine import run_with_late_joiners

from jupyter_infer.cpu import kernels
from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.engine.hf.ragged import Block, forward
from jupyter_infer.engine.kv import kv_cache

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason="no int4 kernel on this machine")


def _steps(engine: HFEngine, one_call: bool) -> torch.Tensor:
    """Two rows' logits: a left-padded prompt block, then four decode steps (one with every
    column seen), the cache without spare room so that each step grows it."""
    model, lean = engine.model, engine.llama_forward
    saved, calls = lean.one_call, []
    if one_call:
        lean.one_call = _counting(saved, calls)
    else:
        lean.one_call = None
    cache = kv_cache.new_cache(model.config)

    def block(ids: list[list[int]], mask: list[list[int]], positions: list[list[int]]) -> Block:
        return Block(cache, *(torch.tensor(t) for t in (ids, mask, positions)))

    out = []
    try:
        with torch.inference_mode():
            out.append(forward(model, [block([[0, 5, 7], [3, 4, 9]], [[0, 1, 1], [1, 1, 1]], [[0, 0, 1], [0, 1, 2]])],
                               every=True, lean=lean))
            kv_cache.set_spare(cache, 0)
            for step in range(4):
                first = [0] if step < 3 else [1]  # the last step: row 0 sees every column too
                mask = [first + [1] * (3 + step), [1] * (4 + step)]
                out.append(forward(model, [block([[11 + step], [20 + step]], mask, [[2 + step], [3 + step]])], lean=lean))
    finally:
        lean.one_call = saved
    assert len(calls) == (4 if one_call else 0)
    return torch.cat(out)


def _counting(one_call, calls: list[int]):  # noqa: ANN001, ANN202 - a spy around the callable
    class Spy:
        def serves(self, cache: object) -> bool:
            return one_call.serves(cache)

        def __call__(self, *args: object) -> None:
            calls.append(1)
            one_call(*args)

    return Spy()


@pytest.mark.parametrize(("kind", "quantize", "dtype"), [
    ("llama", "int4", "float32"), ("qwen2", "int4", "float32"), ("qwen3", "int4", "float32"),
    ("llama", "int8", "float32"), ("qwen3", "int8", "float32"), ("llama", "none", "float32"),
    ("qwen2", "none", "float32"), ("llama", "none", "bfloat16")])
def test_one_call_gives_the_per_layer_logits_to_the_bit(kind: str, quantize: str, dtype: str, tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    # qwen2: q/k/v biases; qwen3: per-head q/k norms; int8: our q8_0-form linears; none: float32
    # in ours; bfloat16: our bfloat16 blocks in a float32 model (hf_load.held_as)
    engine = HFEngine(str(checkpoint(kind, tiny_model_dir, tmp_path / kind)), dtype=dtype, num_threads=2,
                      quantize=quantize)
    assert engine.llama_forward.one_call is not None and "one C call" in engine.info.details["forward"]
    assert torch.equal(_steps(engine, one_call=True), _steps(engine, one_call=False))


def test_eager_layers_keep_the_per_layer_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    # eager float32 linears are aten's: called layer by layer.
    engine = HFEngine(str(checkpoint("llama", tiny_model_dir, tmp_path / "llama")), dtype="float32", num_threads=1,
                      prepack_weights=False)
    assert engine.llama_forward is not None and engine.llama_forward.one_call is None


@pytest.mark.asyncio
async def test_answers_through_the_scheduler_do_not_change(llama_model_dir: Path) -> None:
    # Rows join a running batch and leave it: the one call serves the decode steps between.
    engine = HFEngine(str(llama_model_dir), dtype="float32", num_threads=2, quantize="int4")
    calls: list[int] = []
    one_call = engine.llama_forward.one_call
    engine.llama_forward.one_call = _counting(one_call, calls)
    ours = await run_with_late_joiners(engine, "continuous")
    engine.llama_forward.one_call = None
    theirs = await run_with_late_joiners(engine, "continuous")
    assert calls
    assert [r.token_ids for r in ours] == [r.token_ids for r in theirs]
