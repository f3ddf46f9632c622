"""``PeerSuite``: the package's benchmark suite with the other servers and libraries beside ours."""

from __future__ import annotations

from pathlib import Path

from benchmarks.generate_baselines import Sequential, StaticBatch
from benchmarks.hf_continuous import TransformersContinuous
from jupyter_infer.commands.bench.contenders import Contender, in_fresh_thread
from jupyter_infer.commands.bench.suite import Setup, Suite


class PeerSuite(Suite):
    def _sections(self):  # noqa: ANN202 - Suite's
        return (*super()._sections(), ({"cpu"}, self._measure_cpu), ({"real_size"}, self._measure_real_size),
                ({"embeddings"}, self._measure_embeddings))

    def peers(self, section: str, setup: Setup, rows: int, longest: int) -> list[Contender]:
        """``generate`` (closed workloads) and transformers' continuous batching beside ours;
        for the agents, its prefix sharing (its paged cache holds what they hold at once)."""
        engine = setup.engine
        manager = in_fresh_thread(lambda: TransformersContinuous(
            setup.model_dir, engine.text.tokenize, engine.model.dtype, rows, longest, device=engine.device,
            block_sharing=section == "agents"))
        if section == "batching":
            self.results["meta"]["hf_cb_cache"] = manager.cache_config
            return [Sequential(engine), StaticBatch(engine), manager]
        return [manager]

    def start_http_peers(self, setup: Setup, contenders: list[Contender], notes: list[str]) -> None:
        """Start ``transformers serve`` and ``llama-server`` into ``contenders`` (closed by the
        caller, even if a later one fails); a peer that cannot start is a note."""
        from benchmarks.peers import llama_server, transformers_serve

        cfg, burst = self.config, setup.burst
        longest = max(setup.count(a.prompt) + a.max_tokens for a in burst.arrivals)
        gguf = cfg.gguf or str(Path(setup.model_dir) / "model.gguf")
        peers = (("transformers serve", lambda: transformers_serve(
                      setup.model_dir, setup.engine.device, cfg.dtype, setup.threads, len(burst.arrivals), longest,
                      cfg.out / "transformers-serve.log")),
                 ("llama-server", lambda: llama_server(gguf, setup.threads, len(burst.arrivals), longest * 2,
                                                       cfg.out / "llama-server.log")))
        for what, start in peers:
            try:
                peer = start()
            except Exception as err:
                notes.append(f"{what} not measured: {err}")
                self.log(f"  {notes[-1]}")
                continue
            contenders.append(peer)
            self.log(f"  {what}: {peer.base_url} ready in {peer.process.startup_s:.1f} s")

    def _measure_cpu(self, setup: Setup) -> None:
        """[g] the CPU forward pass against llama.cpp, and each variant's quality."""
        from benchmarks import cpu

        measured = cpu.measure(self.config, self.log, setup.model_dir, setup.threads, setup.count)
        self.results["workloads"].update(measured.workloads)
        self.results["cpu_quality"] = measured.quality

    def _measure_real_size(self, setup: Setup) -> None:
        """[g] the same at a real size (the 0.5b shape)."""
        from benchmarks import real_size

        self.results["workloads"].update(real_size.measure(self.config, self.log, setup.threads))

    def _measure_embeddings(self, setup: Setup) -> None:
        """[k] a batch of 64 texts embedded, against llama-server --embedding (issue 56)."""
        from benchmarks import embeddings

        self.results["workloads"].update(embeddings.measure(self.config, self.log, setup.threads))
