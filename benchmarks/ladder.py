"""[l] the ladder (issue 49): ours against llama.cpp's ``llama-server`` at the sizes users run.

    python -m benchmarks.ladder --sizes 1.5b 7b --llama-server PATH [--llama-quantize PATH]
                                [--gguf-converter PATH] [--threads 2] [--out DIR]

For each size it builds (once, cached under ``~/.cache/jupyter_infer/models/<size>``) a
random-weight checkpoint in that public shape (``make-model --size``: Qwen2.5-1.5B/-3B/-7B,
Llama-3.1-8B, in bfloat16), converts it to GGUF (f16 or q8_0, then q4_0 and Q4_K_M with
``llama-quantize``), and measures each server started as a user would, one at a time, on the
same threads:

- ours (``jupyter infer serve``) in int4, int8 and bfloat16, and on the Q4_K_M file itself;
- ``llama-server`` on q4_0, q8_0, f16 and Q4_K_M;
- with ``--ik-llama-server``, ik_llama.cpp's server (the CPU-focused fork) on q4_0 and q8_0 with
  its best CPU flags: ``-rtr`` (weights repacked at load into its row-interleaved forms) and
  flash attention.

Each: time to ready (process start to the health route's 200; ours twice: the first start
quantizes and fills an empty weight cache, the second reads it), peak and resident memory of the
server process, one stream (64 tokens, three requests one after another), a burst of 8 × 32
tokens, and the time to first token of a fresh prompt of ~1k tokens; ours int4 and q4_0 also at
~3k and ~8k (prompt tokens per second = tokens / TTFT). Speculation off, prompt caches off.
It prints which llama.cpp build ran (its version and the instruction sets it says it uses), and
beside each one stream the share of the machine's read bandwidth it reaches
(``memory_bound``: weight bytes a token reads x tokens/s, over a 2 GiB ``torch.sum`` at the same
threads), the bound every one-stream ratio runs into.

With ``--agents``, ours int4, llama-server q4_0 (and ik_llama.cpp's q4_0) then run agents as a
notebook's would, each server with its prompt cache on (ours' prefix cache, llama.cpp's
``cache_prompt``): 8 agents
× 3 rounds over one ~3k-token tool prompt, each round the agent's history plus ~96 new tokens (a
task, then tool results), 32 tokens of answer, an agent's next round sent when its answer is
done; the wall time of all of them and the TTFT median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_infer.commands.bench.completions import stream_completions
from jupyter_infer.commands.loadgen import Arrival
from jupyter_infer.commands.model_builder import LADDER, default_cache_dir, make_model
from jupyter_infer.kernel.launcher import free_port

from .memory_bound import bytes_per_token, read_bandwidth_gbs, share
from .peers import ServerProcess, llama_server

TOKEN = "ladder-bench"
LONG_PROMPTS = (1024, 3072, 8192)
# agents, rounds, tokens of the tool prompt they share, new tokens a round, tokens of answer
AGENTS = (8, 3, 3072, 96, 32)
# (name, label, what it serves): ours by quantize (or a GGUF), llama-server by GGUF type.
OURS = (("ours_int4", "ours int4", "int4"), ("ours_int8", "ours int8", "int8"),
        ("ours_bf16", "ours bfloat16", "none"), ("ours_q4_k_m", "ours on the Q4_K_M file", "Q4_K_M"))
LLAMA = (("llama_q4_0", "llama-server q4_0", "q4_0"), ("llama_q8_0", "llama-server q8_0", "q8_0"),
         ("llama_f16", "llama-server f16", "f16"), ("llama_q4_k_m", "llama-server Q4_K_M", "Q4_K_M"))
# ik_llama.cpp's server: repacked at load (-rtr), flash attention; its KV is one buffer split
# evenly between slots (no --kv-unified), so each slot gets the longest prompt's room.
IK = (("ik_q4_0", "ik_llama.cpp q4_0 -rtr", "q4_0"), ("ik_q8_0", "ik_llama.cpp q8_0 -rtr", "q8_0"))
IK_ARGS = ["-rtr", "-fa", "on", "--webui", "none"]
PAIRS = (("ours_int4", "llama_q4_0"), ("ours_int8", "llama_q8_0"), ("ours_bf16", "llama_f16"),
         ("ours_q4_k_m", "llama_q4_k_m"), ("ours_int4", "llama_q4_k_m"), ("ours_int4", "ik_q4_0"),
         ("ours_int8", "ik_q8_0"))
# The form whose bytes a contender's token reads (memory_bound.bytes_per_token): ours by its
# format over the GGUF's shapes, a llama.cpp server by its file (None); ours on the Q4_K_M file
# mixes forms, so no share is printed for it.
READS = {"ours_int4": ("q4_0", "int4"), "ours_int8": ("q8_0", "int8"), "ours_bf16": ("q4_0", "bf16"),
         **{name: (kind, None) for name, _, kind in (*LLAMA, *IK)}}


def ggufs(model_dir: Path, converter: str | None, quantize: str | None) -> dict[str, Path]:
    """The model's GGUFs (made once, beside it): f16 (q8_0 instead for the 7-8B shapes, whose
    f16 file would be another 15 GB), then q4_0 and Q4_K_M from it."""
    out: dict[str, Path] = {}
    big = model_dir.name in ("7b", "8b")
    base_type = "q8_0" if big else "f16"
    base = model_dir / f"model-{base_type}.gguf"
    if not base.is_file():
        if not converter:
            raise RuntimeError(f"no {base} and no --gguf-converter to make it")
        done = subprocess.run([sys.executable, "-m", "benchmarks.gguf_convert", converter, str(model_dir), "--outfile",
                               str(base), "--outtype", base_type], capture_output=True, text=True)
        if done.returncode != 0:
            # The converter imports packages of its own (sentencepiece): say which, and the fix.
            hint = " (pip install -e '.[bench]' installs what the converter imports)" if "No module named" in done.stderr else ""
            raise RuntimeError(f"llama.cpp's converter failed on {model_dir}{hint}: {done.stderr.strip()[-400:]}")
    out[base_type] = base
    for kind in ("q8_0", "q4_0", "Q4_K_M"):
        path = model_dir / f"model-{kind}.gguf"
        if kind not in out and not path.is_file():
            if not quantize:
                raise RuntimeError(f"no {path} and no --llama-quantize to make it")
            subprocess.run([quantize, *(["--allow-requantize"] if big else []), str(base), str(path), kind, "2"],
                           check=True, capture_output=True)
        out[kind] = path
    return out


def prompt_of(tokenizer: Any, tokens: int, seed: int) -> str:
    """A fresh text of about ``tokens`` tokens (random vocabulary pieces: no two alike, so no
    prefix is shared with another request)."""
    rng = random.Random(seed)
    specials = set(tokenizer.all_special_ids)
    ids = [i for i in rng.choices(range(len(tokenizer)), k=tokens) if i not in specials]
    text = tokenizer.decode(ids)
    return tokenizer.decode(tokenizer(text)["input_ids"][:tokens])


def measure(base_url: str, model: str, tokenizer: Any, long: tuple[int, ...], headers: dict[str, str],
            extra: dict[str, Any], seed: int) -> dict[str, Any]:
    """One stream, a burst, and the TTFT of fresh prompts of ``long`` tokens."""

    def run(arrivals: list[Arrival], chained: bool = False) -> tuple[list[Any], float]:
        chains = [arrivals] if chained else None
        traces, wall = asyncio.run(stream_completions(base_url, model, [] if chained else arrivals, chains=chains,
                                                      headers=headers, extra=extra))
        if errors := [t.error for t in traces if t.error]:
            raise RuntimeError(errors[0])
        return traces, wall

    short = [prompt_of(tokenizer, 24, seed + i) for i in range(12)]
    run([Arrival(at=0.0, prompt=short[0], max_tokens=8)])  # warm up
    traces, _ = run([Arrival(at=0.0, prompt=p, max_tokens=64) for p in short[1:4]], chained=True)
    decode = sorted((t.tokens - 1) / (t.done - t.token_times[0]) for t in traces)
    traces, wall = run([Arrival(at=0.0, prompt=p, max_tokens=32) for p in short[4:12]])
    out: dict[str, Any] = {"one_stream_tok_s": decode[1], "burst_tok_s": sum(t.tokens for t in traces) / wall}
    for n in long:
        text = prompt_of(tokenizer, n, seed + n)
        # A few tokens, not one: a first token that is half a character has no text to stream,
        # and its chunk would not count as the first (then the answer's end bounds it).
        traces, _ = run([Arrival(at=0.0, prompt=text, max_tokens=4)])
        trace = traces[0]
        ttft = (trace.ttft_ms if trace.ttft_ms is not None else trace.latency_ms) / 1000
        out[f"ttft_{n}_s"], out[f"prompt_{n}_tok_s"] = ttft, n / ttft
    return out


def agents(base_url: str, model: str, tokenizer: Any, headers: dict[str, str], extra: dict[str, Any],
           seed: int) -> dict[str, Any]:
    """``AGENTS``' chains against a server: the wall time of all of them and the TTFT median."""
    count, rounds, shared, new, answer = AGENTS
    tools = prompt_of(tokenizer, shared, seed + 7)
    chains = []
    for a in range(count):
        history, chain = tools, []
        for r in range(rounds):
            history += prompt_of(tokenizer, new, seed + 1000 * (a + 1) + r)  # the task, then a tool's result
            chain.append(Arrival(at=0.0, prompt=history, max_tokens=answer))
        chains.append(chain)
    traces, wall = asyncio.run(stream_completions(base_url, model, [], chains=chains, headers=headers, extra=extra))
    if errors := [t.error for t in traces if t.error]:
        raise RuntimeError(errors[0])
    ttfts = sorted(t.ttft_ms if t.ttft_ms is not None else t.latency_ms for t in traces)
    # The first round's TTFTs: every agent's first request needs the tool prompt's KV.
    first = [t.ttft_ms if t.ttft_ms is not None else t.latency_ms for t in traces[::rounds]]
    return {"agents_wall_s": wall, "agents_ttft_p50_ms": ttfts[len(ttfts) // 2],
            "agents_first_round_ttft_max_ms": max(first)}


def ours(model_dir: Path, what: str, ggufs_: dict[str, Path], threads: int, log_dir: Path, cache: str,
         starts: int, prefix_cache: bool = False, options: tuple[str, ...] = ()) -> tuple[list[ServerProcess], str]:
    """Our server on ``what`` (a quantize, or a GGUF type), started ``starts`` times on the weight
    cache ``cache`` (an empty folder: the first start fills it); the last one left running.
    ``prefix_cache``: at its default size (else off)."""
    model = str(ggufs_[what]) if what in ggufs_ else str(model_dir)
    quantize = what if what in ("int4", "int8") else "none"
    port = free_port()
    cmd = [sys.executable, "-m", "jupyter_infer.commands.cli", "serve", "--model", model, "--quantize", quantize,
           "--threads", str(threads), "--port", str(port), f"--IdentityProvider.token={TOKEN}", "--allow-root",
           "--InferApp.speculative=off", "--ServerApp.open_browser=False",
           *([] if prefix_cache else ["--InferApp.prefix_cache_mb=0"]), *options]
    servers = []
    for i in range(starts):
        if servers:
            servers[-1].stop()
        servers.append(ServerProcess(cmd, f"http://127.0.0.1:{port}/infer/health", log_dir / f"ours-{what}-{i}.log",
                                     env={"JUPYTER_INFER_CACHE": cache}, timeout=3600,
                                     headers={"Authorization": f"token {TOKEN}"}))
    return servers, f"http://127.0.0.1:{port}/infer/v1/"


def llama_build(exe: str) -> str:
    """Which llama.cpp ran: its version line, and how it was built for the CPU (its build
    folder's CMakeCache: native or the instruction sets switched on), beside this CPU's own."""
    from jupyter_infer.cpu.features import cpu_flags

    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    version = " ".join(line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip())
    cache = Path(exe).resolve().parent.parent / "CMakeCache.txt"
    build = "build options unknown (no CMakeCache.txt beside it)"
    if cache.is_file():
        on = [line.split(":", 1)[0] for line in cache.read_text(errors="replace").splitlines()
              if line.startswith("GGML_") and line.endswith(":BOOL=ON")]
        isa = [o for o in on if o.removeprefix("GGML_") in ISA_OPTIONS]
        build = ("GGML_NATIVE=ON (-march=native: this CPU's instruction sets)" if "GGML_NATIVE" in on
                 else f"GGML_NATIVE=OFF, {', '.join(isa) or 'no instruction set options'} on")
        # A build's own flags (-march=native -mno-amx-tile where a VM advertises AMX it faults on).
        flags = next((line.split("=", 1)[1] for line in cache.read_text(errors="replace").splitlines()
                      if line.startswith("CMAKE_C_FLAGS:")), "").strip()
        build += f", CMAKE_C_FLAGS {flags}" if flags else ""
    cpu = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512_vnni", "avx512_bf16", "avx_vnni", "amx"))))
    return f"{version}; {build}; this CPU: {cpu or 'no VNNI, BF16 or AMX flags'}"


ISA_OPTIONS = {"AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI", "AVX_VNNI", "FMA", "F16C",
               "AMX_TILE", "AMX_INT8", "AMX_BF16"}


def _measured(label: str, servers: list[ServerProcess], url: str, model: str, tokenizer: Any,
              long: tuple[int, ...], headers: dict[str, str], extra: dict[str, Any], seed: int,
              cached: dict[str, Any] | None = None) -> dict[str, Any]:
    """A contender's figures (``measure``, its start times, its memory at ready and after; then,
    given ``cached`` (the request fields of its prompt cache), ``agents``); its running server
    stopped."""
    last = servers[-1]
    try:
        entry = {"label": label, "ready_s": [s.startup_s for s in servers], **last.memory_mb()}
        entry.update(measure(url, model, tokenizer, long, headers, extra, seed))
        entry.update({f"after_{k}": v for k, v in last.memory_mb().items()})
        if cached is not None:
            entry.update(agents(url, model, tokenizer, headers, {**extra, **cached}, seed))
    finally:
        last.stop()
    return entry


def run_size(size: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Every contender on one size, one at a time (each alone on the machine)."""
    from transformers import AutoTokenizer

    model_dir = make_model(default_cache_dir() / size, size=size)
    files = ggufs(model_dir, args.gguf_converter, args.llama_quantize)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    log_dir = args.out / size
    log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    headers = {"Authorization": f"token {TOKEN}"}
    for name, label, what in OURS:
        if name not in args.contenders:
            continue
        log(f"  {label}")
        with tempfile.TemporaryDirectory(prefix="ladder-weights-") as cache:  # GBs at 7B: not left behind
            with_agents = args.agents and name == "ours_int4"
            servers, url = ours(model_dir, what, files, args.threads, log_dir, cache,
                                starts=2 if name == "ours_int4" else 1, prefix_cache=with_agents)
            results[name] = _measured(label, servers, url, str(files.get(what, model_dir)), tokenizer,
                                      args.long if name == "ours_int4" else args.long[:1], headers,
                                      {"ignore_eos": True}, args.seed, {} if with_agents else None)
        log(f"    {_with_reads(name, results[name], files, args.bandwidth_gbs)}")
    _llama_cpp(LLAMA, args.llama_server, files, tokenizer, args, log_dir, results, log)
    builds = {"llama_build": llama_build(args.llama_server)}
    if args.ik_llama_server:
        _llama_cpp(IK, args.ik_llama_server, files, tokenizer, args, log_dir, results, log)
        builds["ik_llama_build"] = llama_build(args.ik_llama_server)
    return {"model": str(model_dir), "contenders": results, "read_gbs": args.bandwidth_gbs, **builds}


def _with_reads(name: str, entry: dict[str, Any], files: dict[str, Path], bandwidth_gbs: float) -> dict[str, Any]:
    """``entry`` with the weight bytes its token reads and its one stream's share of the read
    bandwidth (``READS``; none for a contender of mixed forms)."""
    kind, form = READS.get(name, (None, None))
    if kind in files:
        entry["bytes_per_token"] = bytes_per_token(files[kind], form)
        entry["read_share"] = share(entry.get("one_stream_tok_s"), entry["bytes_per_token"], bandwidth_gbs)
    return entry


def _llama_cpp(table: tuple[tuple[str, str, str], ...], exe: str, files: dict[str, Path], tokenizer: Any,
               args: argparse.Namespace, log_dir: Path, results: dict[str, Any], log: Any) -> None:
    """A llama.cpp server's contenders (``LLAMA``: mainline's llama-server; ``IK``: ik_llama.cpp's,
    with ``IK_ARGS``), one at a time; the table's first (q4_0) also times the longer prompts and,
    where ``--agents`` asks, runs the agents with its prompt cache on."""
    ik = table is IK
    count, rounds, shared, new, answer = AGENTS
    for i, (name, label, kind) in enumerate(table):
        if name not in args.contenders or kind not in files:
            continue
        log(f"  {label}")
        with_agents = args.agents and i == 0
        history = shared + rounds * new + answer + 256 if with_agents else 0
        longest = max(args.long) + 2048
        if ik:
            # Its KV is split evenly between the 8 slots: each gets the longest prompt's room or an
            # agent's history; and its own log beside ours, not a llama.log in the working folder.
            per_slot, server_args = max(longest, history), [*IK_ARGS, "--log-file", str(log_dir / f"ik-{kind}-own")]
        else:
            # One KV buffer for all 8 slots (--kv-unified), room for the longest prompt in any of
            # them (and for every agent's history at once, where they run).
            per_slot, server_args = -(-max(longest, count * history) // 8), ["--kv-unified"]
        peer = llama_server(str(files[kind]), args.threads, 8, per_slot,
                            log_dir / f"{'ik' if ik else 'llama'}-{kind}.log", exe=exe, name=name, label=label,
                            args=server_args)
        results[name] = _measured(label, [peer.process], peer.base_url, str(files[kind]), tokenizer,
                                  args.long if i == 0 else args.long[:1], {}, {"ignore_eos": True, **peer.extra},
                                  args.seed, {"cache_prompt": True} if with_agents else None)
        log(f"    {_with_reads(name, results[name], files, args.bandwidth_gbs)}")


def columns(long: tuple[int, ...] = LONG_PROMPTS) -> tuple[tuple[str, str], ...]:
    return (("ready s", "ready_s"), ("peak MiB", "after_peak_mb"), ("resident MiB", "after_resident_mb"),
            ("1 stream tok/s", "one_stream_tok_s"), ("of read bw", "read_share"), ("burst 8 tok/s", "burst_tok_s"),
            *((f"prompt {n} tok/s", f"prompt_{n}_tok_s") for n in long),
            ("agents wall s", "agents_wall_s"), ("agents TTFT p50 ms", "agents_ttft_p50_ms"))


def _cell(value: Any, key: str = "") -> str:
    if value is None:
        return "–"
    if key == "read_share":
        return f"{value:.0%}"
    if isinstance(value, list):
        return " / ".join(f"{v:.1f}" for v in value)
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table(size: str, entry: dict[str, Any], long: tuple[int, ...] = LONG_PROMPTS) -> str:
    """One size's contenders side by side, and ours against llama-server's in pairs."""
    contenders = entry["contenders"]
    cols = columns(long)
    lines = [f"\n[l] {size} ({entry['model']}); llama.cpp: {entry['llama_build']}",
             *([f"  ik_llama.cpp: {entry['ik_llama_build']}"] if entry.get("ik_llama_build") else []),
             f"  read bandwidth at these threads: {entry.get('read_gbs', 0):.1f} GB/s (2 GiB torch.sum, best of 5);"
             " 'of read bw' = weight bytes a token reads x one-stream tok/s over it",
             f"  {'':<34}" + "".join(f"{title:>19}" for title, _ in cols)]
    for c in contenders.values():
        lines.append(f"  {c['label']:<34}" + "".join(f"{_cell(c.get(key), key):>19}" for _, key in cols))
    lines.append("  ratios (ours / the llama.cpp server; ready and memory: lower is better, ours' second start):")
    for a, b in PAIRS:
        if a in contenders and b in contenders:
            x, y = contenders[a], contenders[b]
            ratios = []
            for _, key in cols:
                if key == "read_share":  # each side's share is on its own row
                    ratios.append("")
                    continue
                u, v = x.get(key), y.get(key)
                if isinstance(u, list):
                    u, v = u[-1], v[-1]
                ratios.append(f"{u / v:.2f}" if u and v else "–")
            lines.append(f"  {x['label'] + ' / ' + y['label'].removeprefix('llama-server '):<34}"
                         + "".join(f"{r:>19}" for r in ratios))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ladder", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1.5b"], choices=list(LADDER))
    parser.add_argument("--llama-server", required=True, metavar="PATH")
    parser.add_argument("--ik-llama-server", metavar="PATH",
                        help="ik_llama.cpp's llama-server: its q4_0 and q8_0 (-rtr, flash attention) join the contenders")
    parser.add_argument("--llama-quantize", metavar="PATH", help="default: beside llama-server")
    parser.add_argument("--gguf-converter", metavar="PATH", help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contenders", nargs="+", default=[n for n, _, _ in (*OURS, *LLAMA, *IK)],
                        choices=[n for n, _, _ in (*OURS, *LLAMA, *IK)])
    parser.add_argument("--long", nargs="+", type=int, default=list(LONG_PROMPTS), metavar="TOKENS",
                        help="the fresh prompts whose first token is timed (ours int4 and q4_0; the others: the first)")
    parser.add_argument("--agents", action="store_true",
                        help="then 8 agents x 3 rounds on a ~3k-token tool prompt (ours int4 and q4_0, prompt caches on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/ladder"))
    args = parser.parse_args(argv)
    if not args.llama_quantize:
        beside = Path(args.llama_server).with_name("llama-quantize")
        args.llama_quantize = str(beside) if beside.is_file() else None
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.bandwidth_gbs = read_bandwidth_gbs(args.threads)  # before any server: the machine alone
    print(f"[l] read bandwidth at {args.threads} threads: {args.bandwidth_gbs:.1f} GB/s (2 GiB torch.sum)", flush=True)
    results = {}
    for size in args.sizes:
        print(f"[l] {size}", flush=True)
        results[size] = run_size(size, args, lambda line: print(line, flush=True))
        print(table(size, results[size], tuple(args.long)), flush=True)
        (args.out / "ladder.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
