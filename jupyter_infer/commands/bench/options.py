"""What one benchmark run measures: the model, the workloads, their sizes, the repeats."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import workloads as wl


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
    workloads: tuple[str, ...] = ()  # which to run: the command's --only, else every one it offers
    # The other servers (benchmarks/): where they and their files are.
    gguf: str | None = None  # llama-server's model; None: <model>/model.gguf if there
    llama_server: str | None = None  # the llama-server binary; None: the one on PATH, if any
    gguf_converter: str | None = None  # llama.cpp's convert_hf_to_gguf.py, to make missing GGUFs
    llama_quantize: str | None = None  # llama.cpp's llama-quantize (q4_0, q4_K_M); None: beside llama-server
    real_model: str | None = None  # [g]'s real-size row; None: the locally built "0.5b" ("llama-tiny" with quick)
    out: Path = field(default_factory=lambda: Path("bench-results"))

    @property
    def quantizer(self) -> str | None:
        """llama-quantize: as given, else beside llama-server, else on PATH."""
        import shutil

        if self.llama_quantize:
            return self.llama_quantize
        server = self.llama_server or shutil.which("llama-server")
        beside = Path(server).parent / "llama-quantize" if server else None
        return str(beside) if beside and beside.is_file() else shutil.which("llama-quantize")

    @property
    def sizes(self) -> dict[str, Any]:
        """Workload sizes: the issues', or a few small ones for a quick CI run.

        agents: (agents, system prompt tokens, new tokens per round); interference: (streams,
        their new tokens, the late prompt's tokens, tokens streamed before it arrives);
        lengths: (short prompts, the long one's tokens, new tokens each); structured: (streams,
        max_tokens of a constrained answer, requests one at a time); users: (A's requests, their
        tokens, B's requests, their tokens)."""
        if self.quick:  # the tiny model has 512 positions
            return {"burst": (8, 16), "mixed": (8, (4, 8, 16, 32)), "open": 8, "open_tokens": 16,
                    "agents": (4, 120, 8), "interference": (4, 24, 300, 3), "lengths": (7, 300, 16),
                    "structured": (16, 256, 16), "users": (48, 48, 3, 8)}
        return {"burst": (16, 32), "mixed": (32, wl.MIXED_CYCLE), "open": 48, "open_tokens": 32,
                "agents": (8, 500, 32), "interference": (4, 64, 800, 4), "lengths": (15, 900, 64),
                "structured": (16, 256, 24), "users": (64, 256, 4, 16)}
