"""[g] The CPU forward pass against llama.cpp (issue 14).

Every contender is a server on the same model, driven by the same client (streamed OpenAI
completions, greedy, EOS ignored): ours with eager linears, with prepacked oneDNN linears
(float32, and bfloat16 where the CPU has bf16 instructions) and with int8 (fbgemm); and
llama.cpp's ``llama-server -np N -cb`` on GGUFs of the model in f32, f16 and q8_0. Three
workloads: a burst (all at once), one request at a time, and copy-heavy prompts one at a time
(a 300-600-token piece of code, JSON records or a document, and an answer that reuses it:
issue 20). Ratios compare a precision class with its counterpart: f32 with f32, bf16 with
f16, int8 with q8_0. Speculative decoding: ours f32 is measured with its n-gram speculation
(the default) and without; llama-server f32 without (its default) and with its n-gram
speculation (``--spec-type ngram-mod``).

Quality is measured in-process on a fixed text: each variant's next-token choice at every
position against float32 eager (teacher-forced greedy agreement) and its perplexity.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gguf_convert
from benchmarks.peers import CompletionsPeer, llama_server
from jupyter_infer.commands.bench import workloads as wl
from jupyter_infer.commands.bench.contenders import Contender
from jupyter_infer.commands.bench.options import BenchConfig
from jupyter_infer.commands.bench.rounds import measure_rounds
from jupyter_infer.commands.loadgen import Arrival

# What every request asks: no early stop, so that all contenders decode the same tokens.
REQUEST_EXTRA = {"ignore_eos": True, "stream_options": {"include_usage": True}}
# llama-server's n-gram speculation (issue 20 measured ngram-mod as its best here), on f32.
LLAMA_SPECULATION = ["--spec-type", "ngram-mod"]
# (GGUF type, contender name, llama-server's extra arguments): f32 with its n-gram speculation too.
LLAMA = (("f32", "llama_f32", []), ("f32", "llama_f32_ngram", LLAMA_SPECULATION), ("f16", "llama_f16", []),
         ("q8_0", "llama_q8_0", []))
QUANTIZER_TYPES = ("q4_0", "q4_K_M")  # made by llama-quantize, not by the converter
INT8_AGREEMENT = 0.95  # issue 14's bound on int8's greedy agreement with float32


@dataclass(frozen=True)
class Variant:
    """One of our servers: a name, a label and the InferApp options that make it."""

    name: str
    label: str
    options: dict[str, Any]
    needs_bf16: bool = False
    gguf: str = ""  # serve the model's GGUF of this type (llama-server's own file) instead of its folder

    def missing(self) -> str | None:
        """Why this CPU cannot run it, or None."""
        from jupyter_infer.cpu import kernels
        from jupyter_infer.cpu.model_linears import int8_available
        from jupyter_infer.formats.device_choice import cpu_has_native_bf16

        if self.needs_bf16 and not cpu_has_native_bf16():
            return "this CPU has no bf16 instructions"
        if self.options.get("quantize") == "int8" and not int8_available():
            return "no x86 quantized kernels (fbgemm) here"
        if self.options.get("quantize") == "int4":
            return kernels.unavailable()
        return None


VARIANTS = (
    Variant("f32_eager", "ours f32, eager linears", {"dtype": "float32", "prepack_weights": False}),
    Variant("f32", "ours f32, prepacked", {"dtype": "float32"}),
    Variant("f32_nospec", "ours f32, no speculation", {"dtype": "float32", "speculative": "off"}),
    Variant("bf16", "ours bf16, prepacked", {"dtype": "bfloat16"}, needs_bf16=True),
    Variant("int8", "ours int8", {"dtype": "float32", "quantize": "int8"}),
)
# (ours, llama.cpp's counterpart): the same precision class.
PAIRS = (("f32", "llama_f32"), ("bf16", "llama_f16"), ("int8", "llama_q8_0"))


def workloads(count: Callable[[str], int], burst: tuple[int, int], alone: tuple[int, int],
              copy: tuple[int, tuple[int, int], int]) -> list[wl.Workload]:
    """A burst of ``burst[0]`` requests at once, ``alone[0]`` sent one at a time, and
    ``copy[0]`` copy-heavy ones (contexts of ``copy[1]`` tokens) one at a time."""
    from jupyter_infer.commands.model_builder import CORPUS

    b = wl.burst(count, *burst)

    # One at a time, every round's prompts are new to every contender (``Workload.fresh``).
    def alone_round(i: int) -> wl.Workload:
        prompts = wl.bench_prompts(count, alone[0], offset=i * alone[0])
        return wl.Workload("cpu_alone", f"{alone[0]} requests one at a time, ~20-token prompts, {alone[1]} new "
                           "tokens each, new prompts every round, over HTTP (OpenAI completions)", [],
                           chains=[[Arrival(at=0.0, prompt=p, max_tokens=alone[1]) for p in prompts]], fresh=alone_round)

    def copy_round(i: int) -> wl.Workload:
        copies = wl.copy_heavy(count, copy[0], copy[1], copy[2], document=CORPUS, variant=i)
        return wl.Workload("cpu_copy", f"{copy[0]} copy-heavy requests one at a time ({copy[1][0]}-{copy[1][1]}-token "
                           f"code, JSON records or a document, then what to do with it), {copy[2]} new tokens each, "
                           "new contexts every round, over HTTP", [], chains=[copies], fresh=copy_round)

    return [wl.Workload("cpu_burst", b.description + ", over HTTP (OpenAI completions)", b.arrivals),
            alone_round(0), copy_round(0)]


def gguf_path(model_dir: str, kind: str, converter: str | None, log: Callable[[str], None],
              quantizer: str | None = None) -> Path | None:
    """``<model>/model-<kind>.gguf``; made with llama.cpp's converter when one is given, and
    for the types the converter does not write (q4_0, q4_K_M) with ``llama-quantize`` from
    the f32 one.

    The converter runs in a process of its own, adjusted for our locally built models
    (``gguf_convert``)."""
    target = Path(model_dir) / f"model-{kind}.gguf"
    if kind in QUANTIZER_TYPES and not target.is_file():
        source = gguf_path(model_dir, "f32", converter, log)
        if source is None or not quantizer or not Path(quantizer).is_file():
            return None
        log(f"  quantizing {source.name} to {target.name} with {quantizer}")
        done = subprocess.run([quantizer, str(source), str(target), kind.upper()], capture_output=True, text=True)
        if done.returncode != 0 or not target.is_file():
            raise RuntimeError(f"llama-quantize failed: {(done.stderr or done.stdout)[-600:]}")
        return target
    if target.is_file() or not converter:
        return target if target.is_file() else None
    log(f"  converting the model to {target.name} with {converter}")
    # The child imports benchmarks.gguf_convert: the repository's root on its path.
    root = str(Path(gguf_convert.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", gguf_convert.__name__, converter, model_dir,
                           "--outfile", str(target), "--outtype", kind], capture_output=True, text=True, env=env)
    if done.returncode != 0 or not target.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {(done.stderr or done.stdout)[-600:]}")
    return target


def ours(cfg: BenchConfig, log: Callable[[str], None], v: Variant, model_dir: str, threads: int, parallel: int,
         notes: list[str]) -> CompletionsPeer | None:
    """Our server as ``v`` configures it, ready; None (and a note) where it cannot run here."""
    from jupyter_infer.kernel.client import Client
    from jupyter_infer.kernel.launcher import LocalServer

    if v.missing():
        notes.append(f"{v.label}: not measured, {v.missing()}")
        return None
    model = model_dir
    if v.gguf:
        try:
            found = gguf_path(model_dir, v.gguf, cfg.gguf_converter, log, cfg.quantizer)
        except RuntimeError as err:
            found, why = None, str(err)
        else:
            why = f"no {Path(model_dir) / f'model-{v.gguf}.gguf'} (--gguf-converter and --llama-quantize make it)"
        if found is None:
            notes.append(f"{v.label}: not measured, {why}")
            return None
        model = str(found)
    # `jupyter infer serve`: our server alone, as llama-server is (inside `jupyter lab` the same
    # process also carries JupyterLab's server extensions: ~11 MB more on the 0.5b shape).
    server = LocalServer(alone=True, engine="hf", model=model, num_threads=threads, mode="continuous",
                         max_batch_size=parallel, prefix_cache_mb=0, log_path=str(cfg.out / f"server-{v.name}.log"),
                         **v.options)
    try:
        server.start()
        with Client(server.url, server.token, embedded=False) as client:
            status = client.wait_ready(timeout=600)
    except Exception as err:
        server.stop()
        notes.append(f"{v.label}: not measured: {type(err).__name__}: {err}")
        return None
    details = status.get("details", {})
    log(f"  {v.label}: {details.get('linear_kernels')}, loaded in {details.get('load_s', 0):.1f} s")
    return CompletionsPeer(v.name, v.label, server.url + "infer/v1/", model, headers=server.headers,
                           extra=REQUEST_EXTRA, process=server)


def contenders(cfg: BenchConfig, log: Callable[[str], None], model_dir: str, threads: int, parallel: int,
               context: int, notes: list[str], variants: tuple[Variant, ...] | None = None,
               llama: tuple[tuple[str, str, list[str]], ...] = ()) -> list[Contender]:
    """Our ``variants`` this CPU can run (default: [g]'s), then llama-server per entry of
    ``llama`` (default: [g]'s) whose GGUF it can find or make."""
    out: list[Contender] = []
    for v in variants or VARIANTS:
        peer = ours(cfg, log, v, model_dir, threads, parallel, notes)
        if peer is not None:
            out.append(peer)
    return out + llama_peers(cfg, log, model_dir, threads, parallel, context, llama or LLAMA, notes)


def llama_peers(cfg: BenchConfig, log: Callable[[str], None], model_dir: str, threads: int, parallel: int,
                context: int, table: tuple[tuple[str, str, list[str]], ...], notes: list[str]) -> list[Contender]:
    """llama-server on each (GGUF type, contender name, extra arguments) of ``table`` whose GGUF
    it can find or make; a note for each it cannot."""
    out: list[Contender] = []
    for kind, name, args in table:
        label = f"llama-server {kind}" + (f" {' '.join(args)}" if args else "")
        try:
            gguf = gguf_path(model_dir, kind, cfg.gguf_converter, log, cfg.quantizer)
            if gguf is None:
                raise RuntimeError(f"no {Path(model_dir) / f'model-{kind}.gguf'} (give --gguf-converter, and "
                                   "--llama-quantize for q4_0 and q4_K_M, to make it)")
            peer = llama_server(str(gguf), threads, parallel, context, cfg.out / f"llama-server-{name}.log",
                                exe=cfg.llama_server, name=name, label=label, extra={"ignore_eos": True}, args=args)
        except Exception as err:
            notes.append(f"{label}: not measured: {err}")
            continue
        log(f"  {label}: ready in {peer.process.startup_s:.1f} s")
        out.append(peer)
    return out


def quality(model_dir: str, text: str, threads: int) -> dict[str, Any]:
    """Teacher-forced greedy agreement with float32 eager, and perplexity, on ``text``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jupyter_infer.cpu.model_linears import swap_linears

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(text, return_tensors="pt").input_ids

    def load(dtype: torch.dtype) -> Any:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    def scores(model: Any) -> torch.Tensor:
        limit = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
        with torch.inference_mode():
            return model(input_ids=ids[:, :limit]).logits[0, :-1].float()

    def perplexity(logits: torch.Tensor) -> float:
        targets = ids[0, 1 : logits.shape[0] + 1]
        return math.exp(torch.nn.functional.cross_entropy(logits, targets).item())

    reference = scores(load(torch.float32))
    out: dict[str, Any] = {"tokens": int(reference.shape[0]) + 1,
                           "f32_eager": {"agreement": 1.0, "perplexity": perplexity(reference)}}
    for v in VARIANTS:
        if v.name in ("f32_eager", "f32_nospec") or v.missing():
            continue
        model = load(torch.bfloat16 if v.options.get("dtype") == "bfloat16" else torch.float32)
        swap_linears(model, prepack=v.options.get("prepack_weights", True), quantize=v.options.get("quantize", "none"))
        logits = scores(model)
        agree = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        out[v.name] = {"agreement": agree, "perplexity": perplexity(logits)}
    return out


def format_quality(entry: dict[str, Any]) -> str:
    """The quality table, and whether int8 meets issue 14's agreement bound."""
    lines = [f"  quality on a fixed text ({entry['tokens']} tokens), against f32 eager:",
             f"  {'variant':<14}{'greedy agreement':>18}{'perplexity':>12}"]
    for name, q in entry.items():
        if isinstance(q, dict):
            lines.append(f"  {name:<14}{q['agreement']:>17.1%} {q['perplexity']:>12.2f}")
    if "int8" in entry:
        met = entry["int8"]["agreement"] >= INT8_AGREEMENT
        lines.append(f"  [{'met' if met else 'MISSED':^6}] int8 greedy agreement >= {INT8_AGREEMENT:.0%} (issue 14): "
                     f"{entry['int8']['agreement']:.1%}")
    return "\n".join(lines)


@dataclass(frozen=True)
class CpuResults:
    """What [g] measured: its workloads' entries (as ``results["workloads"]`` holds them) and the
    quality table."""

    workloads: dict[str, Any]
    quality: dict[str, Any]


def measure(cfg: BenchConfig, log: Callable[[str], None], model_dir: str, threads: int,
            count: Callable[[str], int]) -> CpuResults:
    """Run [g]: both workloads over every contender, round-robin; then the quality table."""
    from jupyter_infer.commands.model_builder import CORPUS

    burst, alone = ((8, 8), (3, 8)) if cfg.quick else ((16, 32), (8, 32))
    copy = (3, (120, 240), 16) if cfg.quick else (6, (300, 600), 96)  # the tiny model has 512 positions
    loads = workloads(count, burst, alone, copy)
    log(f"\n[g] the CPU forward pass against llama.cpp ({threads} threads): ours by linear kernels and "
        "precision, llama-server by GGUF type")
    cfg.out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    longest = max(count(a.prompt) + a.max_tokens for w in loads for a in w.requests)
    active = contenders(cfg, log, model_dir, threads, burst[0], longest * 2, notes)
    measured: dict[str, Any] = {}
    try:
        for load in loads:
            log(f"  {load.name}: {load.description}")
            measured[load.name] = {**load.describe(), "contenders": measure_rounds(load, active, cfg.repeats, log)}
    finally:
        for c in active:
            c.close()
    for note in notes:
        log(f"  note: {note}")
    for entry in measured.values():
        entry["notes"] = notes
    quality_entry = quality(model_dir, CORPUS, threads)
    log(format_quality(quality_entry))
    return CpuResults(measured, quality_entry)
