"""[g] at a real size (issue 29): what a user of a 0.5 B model feels, against llama.cpp.

The model has a real small model's shape (``make-model --size 0.5b``: Qwen2.5-0.5B's
dimensions in the Llama architecture, 0.36 B parameters; ``--real-model`` for another, a
trained one say). Ours in f32, bf16 (where the CPU has bf16 instructions), int8 and int4 (and
on llama.cpp's own q4_0 file), and llama-server on GGUFs of the same weights in f32, f16, q8_0,
q4_0 and q4_K_M, each measured one request at a time and in a burst of 16,
speculation off on both sides; then ours int4 and llama-server q4_0 with their n-gram
speculation on. After the rounds, each idle server's resident memory (VmRSS) and its peak
(VmHWM: loading included) are read from /proc, once ours has had its quiet second to hand its
freed heap back (``EngineLoop.IDLE_TRIM_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks import cpu
from benchmarks.cpu import LLAMA_SPECULATION, Variant
from jupyter_infer.commands.bench import workloads as wl
from jupyter_infer.commands.bench.options import BenchConfig
from jupyter_infer.commands.bench.rounds import measure_rounds
from jupyter_infer.commands.loadgen import Arrival
from jupyter_infer.loops.engine_loop import EngineLoop

OFF = {"speculative": "off"}
VARIANTS = (
    Variant("real_f32", "ours f32", {"dtype": "float32", **OFF}),
    Variant("real_int8", "ours int8", {"dtype": "float32", "quantize": "int8", **OFF}),
    Variant("real_int4", "ours int4", {"quantize": "int4", **OFF}),
    Variant("real_int4_spec", "ours int4, n-gram speculation", {"quantize": "int4"}),
    # What `dtype = "auto"` picks on a CPU with bf16 instructions, against llama.cpp's f16.
    Variant("real_bf16", "ours bf16", {"dtype": "bfloat16", **OFF}, needs_bf16=True),
    # llama-server's own q4_0 file, served by us: the same 4-bit weights on both sides.
    Variant("real_gguf_q4_0", "ours on the q4_0 GGUF", OFF, gguf="q4_0"),
)
# (GGUF type, contender name, llama-server's extra arguments)
LLAMA = (("f32", "real_llama_f32", []), ("f16", "real_llama_f16", []), ("q8_0", "real_llama_q8_0", []),
         ("q4_0", "real_llama_q4_0", []), ("q4_K_M", "real_llama_q4_K_M", []),
         ("q4_0", "real_llama_q4_0_ngram", LLAMA_SPECULATION))


def model_dir(cfg: BenchConfig, log: Callable[[str], None]) -> str:
    if cfg.real_model:
        return cfg.real_model
    from jupyter_infer.commands.model_builder import ensure_model

    size = "llama-tiny" if cfg.quick else "0.5b"
    log(f"building/reusing the local {size!r} model for the real-size row (random weights)...")
    return str(ensure_model(size))


def workloads(count: Callable[[str], int], alone: tuple[int, int], burst: tuple[int, int]) -> list[wl.Workload]:
    def alone_round(i: int) -> wl.Workload:
        prompts = wl.bench_prompts(count, alone[0], offset=i * alone[0])
        return wl.Workload("real_alone", f"{alone[0]} requests one at a time, ~20-token prompts, {alone[1]} new "
                           "tokens each, new prompts every round, over HTTP (OpenAI completions)", [],
                           chains=[[Arrival(at=0.0, prompt=p, max_tokens=alone[1]) for p in prompts]], fresh=alone_round)

    b = wl.burst(count, *burst)
    return [alone_round(0), wl.Workload("real_burst", b.description + ", over HTTP (OpenAI completions)", b.arrivals)]


def memory(pid: int | None) -> dict[str, float | None]:
    """A server's resident memory now and at its peak (MB; Linux's /proc)."""
    found: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = {"VmRSS:": "rss_mb", "VmHWM:": "peak_rss_mb"}.get(line.split(":")[0] + ":")
                if key:
                    found[key] = int(line.split()[1]) / 1024
    except (OSError, ValueError, TypeError):
        pass
    return found


def measure(cfg: BenchConfig, log: Callable[[str], None], threads: int) -> dict[str, Any]:
    """Both workloads over every contender, round-robin; each server's memory after them."""
    from transformers import AutoTokenizer

    model = model_dir(cfg, log)
    tokenizer = AutoTokenizer.from_pretrained(model)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    alone, burst = ((3, 8), (8, 8)) if cfg.quick else ((4, 32), (16, 32))
    loads = workloads(count, alone, burst)
    log(f"\n[g] real size ({model}, {threads} threads): ours f32 / bf16 / int8 / int4 against llama-server "
        "f32 / f16 / q8_0 / q4_0 / q4_K_M, speculation off on both sides, then on")
    notes: list[str] = []
    cfg.out.mkdir(parents=True, exist_ok=True)  # the servers' logs go there (run alone: --only real_size)
    longest = max(count(a.prompt) + a.max_tokens for w in loads for a in w.requests)
    active = cpu.contenders(cfg, log, model, threads, burst[0], longest * 2, notes, VARIANTS, LLAMA)
    measured: dict[str, Any] = {}
    try:
        for load in loads:
            log(f"  {load.name}: {load.description}")
            measured[load.name] = {**load.describe(), "contenders": measure_rounds(load, active, cfg.repeats, log),
                                   "notes": notes, "model": model}
        time.sleep(EngineLoop.IDLE_TRIM_S + 1.0)  # the servers idle, as a user's between two uses
        for c in active:
            pids = c.pids()
            used = memory(pids[0] if pids else None)
            for entry in measured.values():
                if c.name in entry["contenders"]:
                    entry["contenders"][c.name]["median"].update(used)
    finally:
        for c in active:
            c.close()
    for note in notes:
        log(f"  note: {note}")
    return measured
