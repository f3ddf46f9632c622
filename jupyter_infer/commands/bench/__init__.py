"""``jupyter infer bench``: ours, measured, in one run: our scheduler's modes and features
against each other and against our own ceiling (bare decode steps, no scheduling).

Workloads: (a) burst, (b) mixed output lengths, (c) open-loop Poisson arrivals at ~70 % of
capacity, (d) the burst over HTTP (our server: SSE and OpenAI completions), (e) agents sharing
a system prompt (with and without our prefix cache), (f) a long prompt arriving while streams
run (with and without chunked prefill), (h) mixed lengths, (i) structured outputs: validity
over a corpus of JSON schemas, throughput against unconstrained (fast-forward off and on), a
new schema's TTFT, (j) users (fair share on and off), (p) the machine's multiply-add peak and our linears' share of
it. Each is warmed up, then repeated
(median of ``--repeats``); the tables, ratios and targets are printed, and written as JSON and
a PNG chart.

The comparisons against other servers and libraries (``generate``, transformers' continuous
batching and ``transformers serve``, llama.cpp's ``llama-server``, [g] the CPU forward pass)
are the repository's ``benchmarks/`` (``python -m benchmarks``, ``make bench``), which runs
this suite with them beside ours. See ``docs/benchmark.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

WORKLOADS = ("burst", "mixed", "open", "agents", "interference", "lengths", "structured", "users", "http", "peak")


def add_arguments(parser: argparse.ArgumentParser, workloads: tuple[str, ...] = WORKLOADS) -> None:
    parser.add_argument("--model", help="a local model folder or hub id (default: the locally built 'small' "
                        "GPT-2-shaped model; 'tiny' with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, small workloads, 1 repeat: an end-to-end check in well under a minute")
    parser.add_argument("--repeats", type=int, help="timed runs per contender and workload (default 3; 1 with --quick)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="where to write results.json and results.png (default bench-results/)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: pick for this machine)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="model dtype (default float32)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                        help="where the models run (default cpu; the HTTP contender follows)")
    parser.add_argument("--max-batch-size", type=int, default=32,
                        help="batch capacity for every batching contender (default 32)")
    parser.add_argument("--only", nargs="+", choices=workloads,
                        help="run only these workloads (the burst always runs when open or http do)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the open-loop arrivals")


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    """The other servers' options (``benchmarks/``)."""
    parser.add_argument("--gguf", help="llama-server's GGUF of the model (default: MODEL/model.gguf); the "
                        "llama-server contender runs when this file exists and llama-server is on PATH")
    parser.add_argument("--llama-server", metavar="PATH",
                        help="llama.cpp's llama-server binary for [g] (default: llama-server on PATH, if any)")
    parser.add_argument("--gguf-converter", metavar="PATH",
                        help="llama.cpp's convert_hf_to_gguf.py: [g] converts the model to the f32, f16 and q8_0 "
                        "GGUFs it lacks (MODEL/model-<type>.gguf)")
    parser.add_argument("--llama-quantize", metavar="PATH",
                        help="llama.cpp's llama-quantize, for the q4_0 and q4_K_M GGUFs of [g]'s real-size row "
                        "(default: beside llama-server, or on PATH)")
    parser.add_argument("--real-model", metavar="DIR",
                        help="[g]'s real-size model (default: the locally built '0.5b', Qwen2.5-0.5B's shape; "
                        "'llama-tiny' with --quick)")


def run(args: argparse.Namespace, suite: type | None = None,
        more_tables: Callable[[dict], str] | None = None) -> int:
    """Run ``suite`` (``Suite``: ours) as ``args`` say; ``more_tables`` prints what a
    section of its own measured."""
    # Never reach for a model hub: the default model is built locally.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from .options import BenchConfig
    from .report import format_tables, format_targets, write_chart, write_json
    from .suite import Suite

    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    peers = {k: getattr(args, k, None) for k in ("gguf", "llama_server", "gguf_converter", "llama_quantize",
                                                 "real_model")}
    config = BenchConfig(
        model=args.model, quick=args.quick, repeats=repeats, num_threads=args.threads, dtype=args.dtype,
        device=args.device, max_batch_size=args.max_batch_size, seed=args.seed, **peers,
        # --only, else every workload the command offers (benchmarks/ offers "cpu" too)
        workloads=tuple(args.only or getattr(args, "workloads", WORKLOADS)), out=args.out,
    )
    results = (suite or Suite)(config, log=lambda line: print(line, flush=True)).run()
    print(format_tables(results))
    if "peak" in results:
        from .peak import table
        print(table(results["peak"]))
    if more_tables is not None:
        print(more_tables(results))
    print(format_targets(results))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(results, args.out / "results.json")
    try:
        write_chart(results, args.out / "results.png")
        chart = f", {args.out / 'results.png'}"
    except ImportError:
        chart = " (no chart: pip install matplotlib, or the project's [bench] extra)"
    print(f"\nwrote {args.out / 'results.json'}{chart}  ({results['meta']['duration_s']:.0f} s in all)")
    return 0
