"""One benchmark run: every contender on every workload, repeated, interleaved, summarized.

``jupyter infer bench`` measures ours: our scheduler in-process (window, continuous, and the
features on and off), our server over HTTP, against our own ceiling (bare decode steps). The
other servers and libraries (``generate``, transformers' continuous batching and ``serve``,
llama.cpp) are the repository's ``benchmarks/`` (``python -m benchmarks``, ``make bench``):
it adds them through ``peers`` and ``start_http_peers``, and its own sections, to the same run.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from . import workloads as wl
from .ceiling import DecodeCeiling
from .completions import CompletionsPeer
from .contenders import Contender, in_fresh_thread
from .options import BenchConfig
from .ours import LengthsApart, OurScheduler, OverHTTP, StandalonePrefill
from .rounds import measure_rounds

OPEN_LOOP_LOAD = 0.7  # offered load of the open-loop workload, as a share of measured capacity


@dataclass(frozen=True)
class Setup:
    """What every section of a run measures with."""

    model_dir: str
    engine: Any  # one HFEngine, shared by the in-process contenders
    threads: int
    count: Callable[[str], int]  # tokens in a text, by the engine's tokenizer
    burst: wl.Workload  # workload (a): the open loop and the HTTP section build on it
    eos_token_ids: frozenset[int] = frozenset()  # the model's own EOS (the engine's is emptied)


class Suite:
    def __init__(self, config: BenchConfig, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log = log
        self.results: dict[str, Any] = {"workloads": {}}

    def run(self) -> dict[str, Any]:
        """Every section the configured workloads call for, in order; the results."""
        started = time.perf_counter()
        setup = self._setup()
        self._describe(setup)
        chosen = set(self.config.workloads)
        for workloads, measure in self._sections():
            if chosen & workloads:
                measure(setup)
        self.results["meta"]["duration_s"] = time.perf_counter() - started
        return self.results

    def _sections(self) -> tuple[tuple[set[str], Callable[[Setup], None]], ...]:
        """The bench's sections in the order they run, each with the workloads that call for it."""
        return (
            ({"burst", "mixed", "open", "http"}, self._measure_batching),  # open and http build on the burst
            ({"agents"}, self._measure_agents),
            ({"interference"}, self._measure_interference),
            ({"lengths"}, self._measure_lengths),
            ({"structured"}, self._measure_structured),
            ({"users"}, self._measure_users),
            ({"http"}, self._measure_http),
            ({"peak"}, self._measure_peak),
        )

    # -- the other servers and libraries (benchmarks/ fills these in) ------------------------------
    def peers(self, section: str, setup: Setup, rows: int, longest: int) -> list[Contender]:
        """Contenders beside ours in ``section`` ("batching", "agents", "lengths"), for ``rows``
        rows of at most ``longest`` tokens; the caller closes them. Here: none."""
        return []

    def start_http_peers(self, setup: Setup, contenders: list[Contender], notes: list[str]) -> None:
        """Start other servers into ``contenders`` for the HTTP section. Here: none."""

    # -- plumbing -----------------------------------------------------------------------------
    def _model_dir(self) -> str:
        if self.config.model:
            return self.config.model
        from ..model_builder import ensure_model

        size = "tiny" if self.config.quick else "small"
        self.log(f"building/reusing the local {size!r} model (random weights)...")
        return str(ensure_model(size))

    def _setup(self) -> Setup:
        from ...engine.hf.hf_engine import HFEngine
        from ...formats.device_choice import default_num_threads

        cfg = self.config
        model_dir = self._model_dir()
        threads = cfg.num_threads or default_num_threads()
        # Nothing runs torch on the main thread: see in_fresh_thread.
        engine = in_fresh_thread(lambda: HFEngine(model_dir, device=cfg.device, dtype=cfg.dtype, num_threads=threads))
        # Every contender generates exactly the tokens asked for: EOS must not end a row early
        # ([i] gives it back: a constrained answer ends at EOS).
        eos, engine.text.eos_token_ids = engine.text.eos_token_ids, frozenset()

        def count(text: str) -> int:
            return len(engine.text.tokenize(text))

        return Setup(model_dir, engine, threads, count, wl.burst(count, *cfg.sizes["burst"]), eos)

    def _describe(self, setup: Setup) -> None:
        """The run's ``meta``: the model, the machine, the versions, the method; and its log line."""
        cfg, info = self.config, setup.engine.info
        meta = self.results["meta"] = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "model": setup.model_dir,
            "architecture": info.details.get("architecture"),
            "parameters": info.details.get("parameters"),
            "dtype": info.dtype,
            "device": info.device,
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
        self.log(f"model {setup.model_dir}: {meta['architecture']}, {meta['parameters'] / 1e6:.1f}M parameters, "
                 f"{meta['dtype']} on {meta['device']}, {meta['torch_threads']} torch threads; "
                 f"{cfg.repeats} repeat(s), median reported")

    def _measure(self, workload: wl.Workload, contenders: list[Contender], warmup: bool = True) -> None:
        """Measure ``contenders`` on ``workload`` (see ``measure_rounds``) into the results."""
        entry = self.results["workloads"].setdefault(workload.name, {**workload.describe(), "contenders": {}})
        entry["contenders"].update(measure_rounds(workload, contenders, self.config.repeats, self.log, warmup))

    # -- the sections -----------------------------------------------------------------------------
    def _measure_batching(self, setup: Setup) -> None:
        """[a] burst, [b] mixed and [c] open loop: in-process batching against the alternatives."""
        cfg, sizes, engine = self.config, self.config.sizes, setup.engine
        mixed = wl.mixed(setup.count, *sizes["mixed"])
        longest = max(setup.count(a.prompt) for a in mixed.arrivals) + max(sizes["mixed"][1])
        ours = {m: OurScheduler(engine, m, cfg.max_batch_size) for m in ("window", "continuous")}
        others = self.peers("batching", setup, cfg.max_batch_size, longest)
        contenders: list[Contender] = [ours["window"], ours["continuous"], *others, DecodeCeiling(engine)]
        try:
            if {"burst", "open", "http"} & set(cfg.workloads):  # open and http build on the burst
                self.log(f"\n[a] burst: {setup.burst.description}")
                self._measure(setup.burst, contenders)
            if "mixed" in cfg.workloads:
                self.log(f"\n[b] mixed: {mixed.description}")
                self._measure(mixed, contenders)
            if "open" in cfg.workloads:  # the contenders that take requests as they come
                self._measure_open_loop(setup, [ours["window"], ours["continuous"],
                                                *(c for c in others if not c.closed_only)])
        finally:
            for other in others:
                other.close()

    def _measure_open_loop(self, setup: Setup, contenders: list[Contender]) -> None:
        """[c]: Poisson arrivals at ``OPEN_LOOP_LOAD`` of the capacity the burst measured."""
        cfg, sizes = self.config, self.config.sizes
        capacity = self._continuous_capacity(setup.burst)
        self.results["meta"]["capacity_req_per_s"] = capacity
        open_ = wl.open_loop(setup.count, sizes["open"], OPEN_LOOP_LOAD * capacity, sizes["open_tokens"], seed=cfg.seed)
        self.log(f"\n[c] open loop: {open_.description}")
        # Everyone is warm from (a) and (b), and a warm-up here would cost a whole run.
        self._measure(open_, contenders, warmup=False)

    def _continuous_capacity(self, burst: wl.Workload) -> float:
        """Requests per second our continuous mode sustains: its burst throughput / tokens each."""
        median = self.results["workloads"]["burst"]["contenders"]["continuous"]["median"]
        per_request = burst.total_tokens / len(burst.arrivals)
        return median["tokens_per_s"] / per_request

    def _measure_agents(self, setup: Setup) -> None:
        """[e] agents sharing a system prompt: our prefix cache on and off, transformers' prefix sharing."""
        cfg, engine = self.config, setup.engine
        agents = wl.agents(setup.count, *cfg.sizes["agents"])
        self.log(f"\n[e] agents: {agents.description}")
        longest = max(setup.count(a.prompt) for a in agents.requests) + cfg.sizes["agents"][2]
        others = self.peers("agents", setup, len(agents.chains), longest)
        try:
            self._measure(agents, [
                OurScheduler(engine, "continuous", cfg.max_batch_size, label="ours: prefix cache"),
                OurScheduler(engine, "continuous", cfg.max_batch_size, name="no_cache",
                             label="ours: no prefix cache", prefix_cache_mb=0),
                *others,
            ])
        finally:
            for other in others:
                other.close()

    def _measure_interference(self, setup: Setup) -> None:
        """[f] a long prompt arriving while streams run: chunked prefill against whole."""
        cfg, engine = self.config, setup.engine
        interference = wl.interference(setup.count, *cfg.sizes["interference"])
        self.log(f"\n[f] interference: {interference.description}")
        self._measure(interference, [
            OurScheduler(engine, "continuous", cfg.max_batch_size,
                         label=f"ours: chunked prefill ({engine.prefill_chunk_tokens})"),
            OurScheduler(engine, "continuous", cfg.max_batch_size, name="no_chunk",
                         label="ours: whole prefill", prefill_chunk_tokens=0),
            StandalonePrefill(engine, cfg.max_batch_size),
        ])

    def _measure_lengths(self, setup: Setup) -> None:
        """[h] mixed lengths: a long prompt beside short ones, against their parts alone; the
        KV memory held against what the tokens need (issue 18)."""
        cfg = self.config
        engine = setup.engine
        lengths = wl.lengths(setup.count, *cfg.sizes["lengths"])
        self.log(f"\n[h] lengths: {lengths.description}")
        longest = max(setup.count(a.prompt) for a in lengths.arrivals) + cfg.sizes["lengths"][2]
        others = self.peers("lengths", setup, cfg.max_batch_size, longest)
        try:
            self._measure(lengths, [
                OurScheduler(engine, "continuous", cfg.max_batch_size, prefix_cache_mb=0),
                LengthsApart(engine, cfg.max_batch_size),
                *others,
            ])
        finally:
            for other in others:
                other.close()

    def _measure_structured(self, setup: Setup) -> None:
        """[i] structured outputs (issue 19): validity over the schema corpus, constrained
        throughput against unconstrained (fast-forward off and on), a new schema's TTFT."""
        from . import structured

        self.results["workloads"].update(structured.measure(
            setup.engine, setup.eos_token_ids, setup.count, self.config.sizes["structured"], self.config.repeats,
            self.log))

    def _measure_peak(self, setup: Setup) -> None:
        """[p] the machine's multiply-add peak and our linears' share of it (issue 49)."""
        from . import peak

        self.log("\n[p] peak: the machine's multiply-add peak, our linears at prompt-sized row counts")
        self.results["peak"] = peak.measure(self.config.quick, self.log)

    def _measure_users(self, setup: Setup) -> None:
        """[j] users (issue 21): B's few short requests during A's burst, fair share on and off."""
        from . import users

        workload = users.users_workload(setup.count, *self.config.sizes["users"])
        self.log(f"\n[j] users: {workload.description}")
        self._measure(workload, users.contenders(setup.engine))

    def _measure_http(self, setup: Setup) -> None:
        """[d] the burst over HTTP: our server (SSE and OpenAI completions) and the other servers."""
        cfg = self.config
        self.log(f"\n[d] over HTTP: the burst through a real jupyter server (engine hf, {setup.threads} threads), "
                 "and other servers on the same model")
        cfg.out.mkdir(parents=True, exist_ok=True)
        try:
            # No prefix cache here: the rounds repeat the same prompts, and a warm cache would
            # flatter the server against the in-process runs (each starts cold) and the peers.
            server = OverHTTP(setup.model_dir, cfg.dtype, setup.threads, cfg.max_batch_size,
                              log_path=str(cfg.out / "server.log"), prefix_cache_mb=0)
        except Exception as err:  # the bench still reports everything else
            self.log(f"  could not start the server: {type(err).__name__}: {err}")
            self.results["workloads"]["http"] = {"error": f"{type(err).__name__}: {err}"}
            return
        notes: list[str] = []
        contenders: list[Contender] = [server, CompletionsPeer(
            "http_openai", "ours over HTTP (OpenAI completions)", server.server.url + "infer/v1/", setup.model_dir,
            headers=server.server.headers, extra={"stream_options": {"include_usage": True}})]
        try:
            self.log(f"  ours: {server.server.url} ready in {server.startup_s:.1f} s")
            self.start_http_peers(setup, contenders, notes)
            self._measure(wl.over_http(setup.burst), contenders)
        finally:
            for c in contenders:
                c.close()
        self._finish_http(setup.burst, notes)

    def _finish_http(self, burst: wl.Workload, notes: list[str]) -> None:
        """The HTTP entry's notes, a note where a server stopped at EOS, and the in-process
        continuous figure of (a) beside it."""
        entry = self.results["workloads"]["http"]
        entry["notes"] = notes
        for key in ("http", "http_openai"):
            tokens = entry["contenders"][key]["median"]["tokens"]
            if tokens != burst.total_tokens:
                # Over HTTP the server's EOS rule stands: throughput counts the tokens it did generate.
                self.log(f"  note: {key}: the server stopped some rows at EOS: {tokens:.0f} of {burst.total_tokens} tokens")
        entry["contenders"]["continuous"] = self.results["workloads"]["burst"]["contenders"]["continuous"]
