"""One benchmark run: every contender on every workload, repeated, interleaved, summarized."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from . import workloads as wl
from .contenders import (
    Contender,
    DecodeCeiling,
    OurScheduler,
    OverHTTP,
    Run,
    Sequential,
    StandalonePrefill,
    StaticBatch,
    TransformersContinuous,
    in_fresh_thread,
)

OPEN_LOOP_LOAD = 0.7  # offered load of the open-loop workload, as a share of measured capacity


@dataclass
class BenchConfig:
    model: str | None = None  # a local folder or hub id; None: the locally built "small" ("tiny" with quick)
    quick: bool = False
    repeats: int = 3
    num_threads: int = 0
    dtype: str = "float32"
    device: str = "cpu"  # the CPU by default: the figures in docs/benchmark.md are CPU figures
    max_batch_size: int = 32
    seed: int = 0
    workloads: tuple[str, ...] = ("burst", "mixed", "open", "agents", "interference", "http", "cpu")
    gguf: str | None = None  # llama-server's model; None: <model>/model.gguf if there
    llama_server: str | None = None  # the llama-server binary; None: the one on PATH, if any
    gguf_converter: str | None = None  # llama.cpp's convert_hf_to_gguf.py, to make missing GGUFs
    out: Path = field(default_factory=lambda: Path("bench-results"))

    @property
    def sizes(self) -> dict[str, Any]:
        """Workload sizes: the issues', or a few small ones for a quick CI run.

        agents: (agents, system prompt tokens, new tokens per round); interference: (streams,
        their new tokens, the late prompt's tokens, tokens streamed before it arrives)."""
        if self.quick:  # the tiny model has 512 positions
            return {"burst": (8, 16), "mixed": (8, (4, 8, 16, 32)), "open": 8, "open_tokens": 16,
                    "agents": (4, 120, 8), "interference": (4, 24, 300, 3)}
        return {"burst": (16, 32), "mixed": (32, wl.MIXED_CYCLE), "open": 48, "open_tokens": 32,
                "agents": (8, 500, 32), "interference": (4, 64, 800, 4)}


def _cpu_sample() -> tuple[float, float, float] | None:
    """(wall s, busy CPU-seconds of the whole machine, this process's CPU-seconds); Linux only."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait
    except (OSError, ValueError, IndexError):
        return None
    t = os.times()
    return time.monotonic(), busy, t.user + t.system


def _other_cpu_share(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> float | None:
    """The share of the machine's CPUs that other processes used meanwhile: a noise gauge."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, min(1.0, others / ((after[0] - before[0]) * (os.cpu_count() or 1))))


def _median_stats(runs: list[Run]) -> dict[str, Any]:
    """The median of every numeric statistic over the repeats."""
    stats = [r.stats() for r in runs]
    out: dict[str, Any] = {}
    for key in stats[0]:
        values = [s[key] for s in stats if isinstance(s.get(key), (int, float))]
        out[key] = statistics.median(values) if values else None
    return out


class Suite:
    def __init__(self, config: BenchConfig, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log = log
        self.results: dict[str, Any] = {"workloads": {}}

    # -- plumbing -----------------------------------------------------------------------------
    def _model_dir(self) -> str:
        if self.config.model:
            return self.config.model
        from ..engine.model_builder import ensure_model

        size = "tiny" if self.config.quick else "small"
        self.log(f"building/reusing the local {size!r} model (random weights)...")
        return str(ensure_model(size))

    def _measure(self, workload: wl.Workload, contenders: list[Contender], warmup: bool = True) -> None:
        """Warm every contender up (not counted), then ``repeats`` interleaved rounds."""
        entry = self.results["workloads"].setdefault(workload.name, {**workload.describe(), "contenders": {}})
        active = [c for c in contenders if c.supports(workload)]
        for c in active if warmup else []:
            t = time.perf_counter()
            in_fresh_thread(c.warmup, workload)
            self.log(f"  {workload.name:<6} {c.label:<34} warm-up {time.perf_counter() - t:6.2f} s")
        runs: dict[str, list[Run]] = {c.name: [] for c in active}
        for round_ in range(self.config.repeats):
            # Round-robin, so that a slow spell of a shared machine hits everyone alike.
            for c in active:
                before = _cpu_sample()
                run = in_fresh_thread(c.run, workload)
                run.extra["other_cpu_share"] = _other_cpu_share(before, _cpu_sample())
                runs[c.name].append(run)
                s = run.stats()
                ttft = "" if s["ttft_p50_ms"] is None else f"  TTFT p50 {s['ttft_p50_ms']:8.1f} ms"
                other = s["other_cpu_share"]
                # Over HTTP the server is another process: its work shows up here too.
                noise = "" if other is None or c.name == "http" else f"  (other processes: {other:.0%} CPU)"
                self.log(f"  {workload.name:<6} {c.label:<34} run {round_ + 1}/{self.config.repeats}: "
                         f"{s['tokens_per_s']:8.1f} tok/s{ttft}{noise}")
        for c in active:
            entry["contenders"][c.name] = {
                "label": c.label,
                "median": _median_stats(runs[c.name]),
                "runs": [r.stats() for r in runs[c.name]],
            }

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from ..engine.hf import HFEngine, default_num_threads

        cfg = self.config
        started = time.perf_counter()
        model_dir = self._model_dir()
        threads = cfg.num_threads or default_num_threads()
        # Nothing runs torch on the main thread: see in_fresh_thread.
        engine = in_fresh_thread(lambda: HFEngine(model_dir, device=cfg.device, dtype=cfg.dtype, num_threads=threads))
        # Every contender generates exactly the tokens asked for: EOS must not end a row early.
        engine.eos_token_ids = frozenset()
        count = lambda text: len(engine.tokenize(text))  # noqa: E731
        sizes = cfg.sizes
        burst = wl.burst(count, *sizes["burst"])
        mixed = wl.mixed(count, *sizes["mixed"])
        longest = max(len(engine.tokenize(a.prompt)) for a in mixed.arrivals) + max(sizes["mixed"][1])
        meta = self.results["meta"] = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "model": model_dir,
            "architecture": engine.info.details.get("architecture"),
            "parameters": engine.info.details.get("parameters"),
            "dtype": engine.info.dtype,
            "device": engine.info.device,
            "torch_threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "repeats": cfg.repeats,
            "quick": cfg.quick,
            "max_batch_size": cfg.max_batch_size,
            "open_loop_load": OPEN_LOOP_LOAD,
        }
        self.log(f"model {model_dir}: {meta['architecture']}, {meta['parameters'] / 1e6:.1f}M parameters, "
                 f"{meta['dtype']} on {meta['device']}, {meta['torch_threads']} torch threads; "
                 f"{cfg.repeats} repeat(s), median reported")

        if {"burst", "mixed", "open", "http"} & set(cfg.workloads):
            self._measure_batching(engine, model_dir, burst, mixed, longest, count, meta)
        if "agents" in cfg.workloads:
            self._measure_agents(engine, model_dir, count)
        if "interference" in cfg.workloads:
            interference = wl.interference(count, *sizes["interference"])
            self.log(f"\n[f] interference: {interference.description}")
            self._measure(interference, [
                OurScheduler(engine, "continuous", cfg.max_batch_size,
                             label=f"ours: chunked prefill ({engine.prefill_chunk_tokens})"),
                OurScheduler(engine, "continuous", cfg.max_batch_size, name="no_chunk",
                             label="ours: whole prefill", prefill_chunk_tokens=0),
                StandalonePrefill(engine, cfg.max_batch_size),
            ])
        if "http" in cfg.workloads:
            self._measure_http(burst, model_dir, threads, count, engine.device)
        if "cpu" in cfg.workloads:
            from . import cpu

            cpu.measure(self, model_dir, threads, count)
        meta["duration_s"] = time.perf_counter() - started
        return self.results

    def _measure_batching(self, engine: Any, model_dir: str, burst: wl.Workload, mixed: wl.Workload,
                          longest: int, count: Callable[[str], int], meta: dict[str, Any]) -> None:
        """[a] burst, [b] mixed and [c] open loop: in-process batching against the alternatives."""
        cfg, sizes = self.config, self.config.sizes
        ours = {m: OurScheduler(engine, m, cfg.max_batch_size) for m in ("window", "continuous")}
        hf_cb = in_fresh_thread(lambda: TransformersContinuous(
            model_dir, engine.tokenize, engine.model.dtype, cfg.max_batch_size, longest, device=engine.device))
        meta["hf_cb_cache"] = hf_cb.cache_config
        contenders: list[Contender] = [Sequential(engine), StaticBatch(engine), ours["window"], ours["continuous"],
                                       hf_cb, DecodeCeiling(engine)]
        try:
            if {"burst", "open", "http"} & set(cfg.workloads):  # open and http build on the burst
                self.log(f"\n[a] burst: {burst.description}")
                self._measure(burst, contenders)
            if "mixed" in cfg.workloads:
                self.log(f"\n[b] mixed: {mixed.description}")
                self._measure(mixed, contenders)
            if "open" in cfg.workloads:
                capacity = self._continuous_capacity(burst)
                rate = OPEN_LOOP_LOAD * capacity
                meta["capacity_req_per_s"] = capacity
                open_ = wl.open_loop(count, sizes["open"], rate, sizes["open_tokens"], seed=cfg.seed)
                self.log(f"\n[c] open loop: {open_.description}")
                # Everyone is warm from (a) and (b), and a warm-up here would cost a whole run.
                self._measure(open_, [ours["window"], ours["continuous"], hf_cb], warmup=False)
        finally:
            hf_cb.close()

    def _measure_agents(self, engine: Any, model_dir: str, count: Callable[[str], int]) -> None:
        cfg = self.config
        agents = wl.agents(count, *cfg.sizes["agents"])
        self.log(f"\n[e] agents: {agents.description}")
        longest = max(count(a.prompt) for a in agents.requests) + cfg.sizes["agents"][2]
        # Its paged cache holds what the agents can hold at once, no more (memory).
        hf_share = in_fresh_thread(lambda: TransformersContinuous(
            model_dir, engine.tokenize, engine.model.dtype, len(agents.chains), longest, device=engine.device,
            block_sharing=True))
        try:
            self._measure(agents, [
                OurScheduler(engine, "continuous", cfg.max_batch_size, label="ours: prefix cache"),
                OurScheduler(engine, "continuous", cfg.max_batch_size, name="no_cache",
                             label="ours: no prefix cache", prefix_cache_mb=0),
                hf_share,
            ])
        finally:
            hf_share.close()

    def _continuous_capacity(self, burst: wl.Workload) -> float:
        """Requests per second our continuous mode sustains: its burst throughput / tokens each."""
        median = self.results["workloads"]["burst"]["contenders"]["continuous"]["median"]
        per_request = burst.total_tokens / len(burst.arrivals)
        return median["tokens_per_s"] / per_request

    def _measure_http(self, burst: wl.Workload, model_dir: str, threads: int, count: Callable[[str], int],
                      device: str) -> None:
        from .peers import CompletionsPeer, llama_server, transformers_serve

        cfg = self.config
        self.log(f"\n[d] over HTTP: the burst through a real jupyter server (engine hf, {threads} threads), "
                 "and other servers on the same model")
        cfg.out.mkdir(parents=True, exist_ok=True)
        try:
            # No prefix cache here: the rounds repeat the same prompts, and a warm cache would
            # flatter the server against the in-process runs (each starts cold) and the peers.
            server = OverHTTP(model_dir, cfg.dtype, threads, cfg.max_batch_size,
                              log_path=str(cfg.out / "server.log"), prefix_cache_mb=0)
        except Exception as err:  # the bench still reports everything else
            self.log(f"  could not start the server: {type(err).__name__}: {err}")
            self.results["workloads"]["http"] = {"error": f"{type(err).__name__}: {err}"}
            return
        notes: list[str] = []
        contenders: list[Contender] = [server, CompletionsPeer(
            "http_openai", "ours over HTTP (OpenAI completions)", server.server.url + "infer/v1/", model_dir,
            headers=server.server.headers, extra={"stream_options": {"include_usage": True}})]
        longest = max(count(a.prompt) + a.max_tokens for a in burst.arrivals)
        gguf = cfg.gguf or str(Path(model_dir) / "model.gguf")
        peers = (("transformers serve", lambda: transformers_serve(
                      model_dir, device, cfg.dtype, threads, len(burst.arrivals), longest,
                      cfg.out / "transformers-serve.log")),
                 ("llama-server", lambda: llama_server(gguf, threads, len(burst.arrivals), longest * 2,
                                                       cfg.out / "llama-server.log")))
        try:
            self.log(f"  ours: {server.server.url} ready in {server.startup_s:.1f} s")
            for what, start in peers:
                try:
                    peer = start()
                except Exception as err:
                    notes.append(f"{what} not measured: {err}")
                    self.log(f"  {notes[-1]}")
                    continue
                contenders.append(peer)
                self.log(f"  {what}: {peer.base_url} ready in {peer.process.startup_s:.1f} s")
            self._measure(wl.over_http(burst), contenders)
        finally:
            for c in contenders:
                c.close()
        entry = self.results["workloads"]["http"]
        entry["notes"] = notes
        for key in ("http", "http_openai"):
            tokens = entry["contenders"][key]["median"]["tokens"]
            if tokens != burst.total_tokens:
                # Over HTTP the server's EOS rule stands: throughput counts the tokens it did generate.
                self.log(f"  note: {key}: the server stopped some rows at EOS: {tokens:.0f} of {burst.total_tokens} tokens")
        entry["contenders"]["continuous"] = self.results["workloads"]["burst"]["contenders"]["continuous"]
