"""[r] prompts after a restart (issue 58): the prefix cache's blocks on disk, measured.

    python -m benchmarks.prompt_restart [--size 0.5b] [--quantize int4] [--tokens 3072]
                                        [--threads 2] [--out DIR]

Our server (``jupyter infer serve``, speculation off, a fresh cache folder for weights and
prompts) is started six times on one random-weight model:

1. cold: three ~3k-token tool prompts, each with a task, alone (TTFT: the whole prompt
   computed), then written to disk by the prefix cache;
2. restarted, once for each: that tool prompt with another task (TTFT: read back);
3. restarted: 8 agents x 3 rounds on the first tool prompt (``ladder.AGENTS``) at once;
4. restarted with ``prefix_cache_disk_mb=0`` (memory only, as before): the same agents.

It prints the TTFT after a restart over the cold one (target <= 0.1) and the agents' wall with
the disk over without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

from jupyter_infer.commands.bench.completions import stream_completions
from jupyter_infer.commands.loadgen import Arrival
from jupyter_infer.commands.model_builder import LADDER_CONTEXT, default_cache_dir, make_model

from .ladder import AGENTS, TOKEN, agents, ours, prompt_of

HEADERS = {"Authorization": f"token {TOKEN}"}
SAMPLES = 3  # tool prompts timed cold and after a restart: the medians are compared


def ttft_s(url: str, model: str, prompt: str) -> float:
    """Seconds to the first token of ``prompt`` sent alone (a few tokens of answer: a first
    token that is half a character streams no text)."""
    traces, _ = asyncio.run(stream_completions(url, model, [Arrival(at=0.0, prompt=prompt, max_tokens=4)],
                                               headers=HEADERS, extra={"ignore_eos": True}))
    trace = traces[0]
    if trace.error:
        raise RuntimeError(trace.error)
    return (trace.ttft_ms if trace.ttft_ms is not None else trace.latency_ms) / 1000


def disk_stats(url: str) -> dict[str, Any]:
    import urllib.request

    status_url = url.removesuffix("v1/") + "status"
    with urllib.request.urlopen(urllib.request.Request(status_url, headers=HEADERS), timeout=30) as answer:
        return json.loads(answer.read())["prefix_cache"]["disk"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    # The ladder's context (32k): room for the tool prompt and every agent's history.
    model_dir = make_model(default_cache_dir() / f"{args.size}-32k", size=args.size, context=LADDER_CONTEXT)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    count, rounds, shared, new, answer = AGENTS
    # SAMPLES tool prompts, the first the agents' (ladder.agents' seed): each timed cold, then
    # each after its own restart (one sample a restart: a second would be a memory hit).
    tools = [prompt_of(tokenizer, args.tokens, args.seed + 7 + i) for i in range(SAMPLES)]
    task = [prompt_of(tokenizer, new, args.seed + 500 + i) for i in range(2)]
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"model": str(model_dir), "quantize": args.quantize, "tool_prompt_tokens": args.tokens}
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as cache:
        def start(label: str, *options: str) -> tuple[Any, str]:
            servers, url = ours(model_dir, args.quantize, {}, args.threads, args.out, cache, starts=1,
                                prefix_cache=True, options=options)
            print(f"  {label}: ready in {servers[-1].startup_s:.1f} s", flush=True)
            return servers[-1], url

        server, url = start("cold")
        try:
            ttft_s(url, str(model_dir), prompt_of(tokenizer, 24, args.seed))  # warm up
            out["cold_ttft_s"] = [ttft_s(url, str(model_dir), t + task[0]) for t in tools]
        finally:
            server.stop()
        out["disk_ttft_s"] = []
        for i, t in enumerate(tools):
            server, url = start(f"restarted ({i + 1})")
            try:
                ttft_s(url, str(model_dir), prompt_of(tokenizer, 24, args.seed + 1 + i))  # warm up, as the cold one
                out["disk_ttft_s"].append(ttft_s(url, str(model_dir), t + task[1]))
                out["disk"] = disk_stats(url)
            finally:
                server.stop()
        for name, options in (("disk", ()), ("memory_only", ("--InferApp.prefix_cache_disk_mb=0",))):
            server, url = start(f"restarted, agents, {name}", *options)
            try:
                out[f"{name}_agents"] = agents(url, str(model_dir), tokenizer, HEADERS, {"ignore_eos": True}, args.seed)
                if name == "disk":
                    out["disk_after_agents"] = disk_stats(url)
            finally:
                server.stop()
    return out


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def report(r: dict[str, Any]) -> str:
    count, rounds, *_ = AGENTS
    return "\n".join([
        f"[r] a {r['tool_prompt_tokens']}-token tool prompt after a restart ({r['quantize']}, {r['model']})",
        f"  TTFT (median of {len(r['cold_ttft_s'])}) cold {median(r['cold_ttft_s']):.2f} s; after a restart, the "
        f"tool prompt from disk {median(r['disk_ttft_s']):.3f} s ({median(r['disk_ttft_s']) / median(r['cold_ttft_s']):.3f}x "
        f"cold; memory only, as before, is a cold one); each: {_list(r['cold_ttft_s'])} / {_list(r['disk_ttft_s'])}",
        f"  {count} agents x {rounds} rounds right after a restart: wall {r['disk_agents']['agents_wall_s']:.1f} s "
        f"from disk, {r['memory_only_agents']['agents_wall_s']:.1f} s memory only "
        f"({r['disk_agents']['agents_wall_s'] / r['memory_only_agents']['agents_wall_s']:.2f}x); TTFT p50 "
        f"{r['disk_agents']['agents_ttft_p50_ms']:.0f} / {r['memory_only_agents']['agents_ttft_p50_ms']:.0f} ms, "
        f"the first round's slowest {r['disk_agents']['agents_first_round_ttft_max_ms']:.0f} / "
        f"{r['memory_only_agents']['agents_first_round_ttft_max_ms']:.0f} ms",
        f"  disk: {r['disk']['hits']} blocks read, {r['disk']['written_blocks']} written, "
        f"{r['disk']['used_mb']:.0f} MB, {r['disk']['rejected']} refused",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt_restart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.5b")
    parser.add_argument("--quantize", default="int4", choices=["int4", "int8", "none"])
    parser.add_argument("--tokens", type=int, default=AGENTS[2], help="the tool prompt's tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/prompt-restart"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    (args.out / "prompt_restart.json").write_text(json.dumps(result, indent=2))
    print(report(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
