"""[k] embeddings (issue 56): a batch of 64 short texts embedded by our server and by llama.cpp.

One request of 64 texts (13-17 words each, new texts every round, the same for every
contender in a round) to ``POST infer/v1/embeddings`` of ``jupyter infer serve`` and to
``llama-server --embedding`` on a GGUF conversion of the same checkpoint, both through the
``openai`` client; rounds round-robin, the median kept (``measure_rounds``). Then each text's
vector from ours against llama-server's f32 one: their cosine, beside the cosine of
different texts' vectors (with random weights every vector leans the same way: the second
says how much the first means).

The checkpoint: a BERT encoder of bge-small's shape (12 layers of 384, 12 heads, MLP 1536,
512 positions; ``--quick``: 2 layers of 128) with random weights, mean pooling and
normalization as its sentence-transformers files say, and a WordPiece tokenizer trained here
(llama.cpp's converter writes a BERT's vocabulary for its WordPiece tokenizer: our byte-level
BPE one would convert, but tokenize differently). ``--real-model`` serves another folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import cpu
from benchmarks.peers import llama_server
from jupyter_infer.commands.bench import workloads as wl
from jupyter_infer.commands.bench.contenders import Contender, Run
from jupyter_infer.commands.bench.options import BenchConfig
from jupyter_infer.commands.bench.rounds import measure_rounds
from jupyter_infer.commands.loadgen import Arrival

TEXTS = 64  # issue 56: "a batch of 64 short texts"
WORDS = 15  # each 13-17 words
TARGET = 2.0  # ours >= 2x llama-server's texts/s (issue 56)
# (name, hidden, layers, heads, MLP): bge-small-en-v1.5's shape; the quick run's tiny one.
SHAPES = {"bge-small": (384, 12, 12, 1536), "bert-tiny": (128, 2, 4, 256)}
VOCAB = 8000
# Ours as the CLI serves it (dtype auto: an encoder's is float32 on a CPU without AMX), and in
# bfloat16 (AVX512-BF16 or AMX).
OURS = (("embed_ours", "ours (dtype auto)", {}), ("embed_ours_bf16", "ours bf16", {"dtype": "bfloat16"}))
# (GGUF type, contender name): llama.cpp's f32 (the faithful one the vectors are checked
# against) and f16 (its half-precision counterpart of our bf16).
LLAMA = (("f32", "embed_llama_f32"), ("f16", "embed_llama_f16"))
# One micro-batch holds every text of the batch (a BERT's sequence must fit one micro-batch).
LLAMA_BATCH = 4096


def build_bert(target: Path, shape: str, seed: int = 0) -> Path:
    """A BERT encoder of ``SHAPES[shape]`` with random weights, a WordPiece tokenizer trained
    on our corpus, and the sentence-transformers files (mean pooling, normalized)."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from jupyter_infer.commands.embedding_builder import MODULES
    from jupyter_infer.commands.model_builder import CORPUS
    from jupyter_infer.values.prompts import SAMPLE_PROMPTS

    marker = target / "bench-bert.json"
    wanted = {"shape": shape, "seed": seed, "vocab": VOCAB}
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return target
    target.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator([*CORPUS.splitlines(), *SAMPLE_PROMPTS], vocab_size=VOCAB,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(str(target))  # vocab.txt
    tokenizer = BertTokenizerFast(vocab_file=str(target / "vocab.txt"), do_lower_case=True, model_max_length=512)
    tokenizer.save_pretrained(target)
    hidden, layers, heads, mlp = SHAPES[shape]
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=mlp, max_position_embeddings=512,
                        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        BertModel._from_config(config, dtype=torch.float32).eval().save_pretrained(target)
    (target / "modules.json").write_text(json.dumps(MODULES, indent=2))
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False}
    (target / "1_Pooling").mkdir(exist_ok=True)
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (target / "2_Normalize").mkdir(exist_ok=True)
    marker.write_text(json.dumps(wanted))
    return target


def model_dir(cfg: BenchConfig, log: Callable[[str], None]) -> str:
    from jupyter_infer.commands.model_builder import default_cache_dir

    shape = "bert-tiny" if cfg.quick else "bge-small"
    log(f"building/reusing the local {shape!r}-shaped BERT for the embeddings row (random weights)...")
    return str(build_bert(default_cache_dir() / f"bench-{shape}", shape))


def workload() -> wl.Workload:
    """Round ``i``'s batch: 64 texts of 13-17 words, new every round."""

    def batch(i: int) -> wl.Workload:
        texts = wl.bench_prompts(lambda text: len(text.split()), TEXTS, WORDS, offset=i * TEXTS)
        return wl.Workload("embeddings", f"one request of {TEXTS} texts ({WORDS - 2}-{WORDS + 2} words each), new "
                           "texts every round, over HTTP (OpenAI embeddings, openai client); tok/s: the texts' tokens",
                           [Arrival(0.0, t, 0) for t in texts], fresh=batch)

    return batch(0)


class EmbeddingsPeer(Contender):
    """An OpenAI-compatible server's ``embeddings`` route: the batch as one request."""

    def __init__(self, name: str, label: str, base_url: str, model: str, process: Any,
                 headers: dict[str, str] | None = None) -> None:
        import openai

        self.name, self.label, self.model, self.process = name, label, model, process
        self.client = openai.OpenAI(base_url=base_url, api_key="none", default_headers=headers or {},
                                    timeout=600, max_retries=0)
        self.vectors: dict[str, list[float]] = {}  # the last round's, by text

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process.pid else []

    def run(self, workload: wl.Workload) -> Run:
        texts = [a.prompt for a in workload.arrivals]
        started = time.perf_counter()
        answer = self.client.embeddings.create(model=self.model, input=texts, encoding_format="float")
        wall = time.perf_counter() - started
        self.vectors = {t: d.embedding for t, d in zip(texts, sorted(answer.data, key=lambda d: d.index), strict=True)}
        tokens = answer.usage.prompt_tokens if answer.usage else 0
        return Run(wall_s=wall, tokens=tokens, extra={"texts": len(texts), "texts_per_s": len(texts) / wall})

    def close(self) -> None:
        self.process.stop()


def ours(cfg: BenchConfig, log: Callable[[str], None], model: str, threads: int,
         notes: list[str]) -> list[Contender]:
    """``jupyter infer serve`` on the checkpoint, as ``OURS`` configures it; a note where it fails."""
    from jupyter_infer.kernel.client import Client
    from jupyter_infer.kernel.launcher import LocalServer

    out: list[Contender] = []
    from jupyter_infer.formats.device_choice import cpu_has_native_bf16

    for name, label, options in OURS[:1] if cfg.quick else OURS:
        if options.get("dtype") == "bfloat16" and not cpu_has_native_bf16():
            notes.append(f"{label}: not measured, this CPU has no bf16 instructions")
            continue
        server = LocalServer(alone=True, engine="hf", model=model, num_threads=threads, mode="continuous",
                             max_batch_size=TEXTS, log_path=str(cfg.out / f"server-{name}.log"), **options)
        try:
            server.start()
            with Client(server.url, server.token, embedded=False) as client:
                status = client.wait_ready(timeout=600)
        except Exception as err:
            server.stop()
            notes.append(f"{label}: not measured: {type(err).__name__}: {err}")
            continue
        details = status.get("details", {})
        log(f"  {label}: {details.get('architecture')}, {status.get('dtype')}, loaded in {details.get('load_s', 0):.1f} s")
        out.append(EmbeddingsPeer(name, label, server.url + "infer/v1/", model, server, server.headers))
    return out


def theirs(cfg: BenchConfig, log: Callable[[str], None], model: str, threads: int,
           notes: list[str]) -> list[Contender]:
    """``llama-server --embedding --pooling mean`` on each GGUF of ``LLAMA`` it can find or make."""
    out: list[Contender] = []
    for kind, name in LLAMA:
        label = f"llama-server {kind} --embedding"
        try:
            gguf = cpu.gguf_path(model, kind, cfg.gguf_converter, log)
            if gguf is None:
                raise RuntimeError(f"no {Path(model) / f'model-{kind}.gguf'} (give --gguf-converter to make it)")
            peer = llama_server(str(gguf), threads, TEXTS, 512, cfg.out / f"llama-server-{name}.log",
                                exe=cfg.llama_server, name=name, label=label,
                                args=["--embedding", "--pooling", "mean", "-b", str(LLAMA_BATCH),
                                      "-ub", str(LLAMA_BATCH)])
        except Exception as err:
            notes.append(f"{label}: not measured: {err}")
            continue
        log(f"  {label}: ready in {peer.process.startup_s:.1f} s")
        out.append(EmbeddingsPeer(name, label, peer.base_url, str(gguf), peer.process))
    return out


def agreement(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, float]:
    """Cosines of ``a``'s and ``b``'s vectors of the same text (min, median), of different
    texts (median), and of the same text's once each side's mean vector is taken away (min:
    random weights point every vector nearly the same way; what is left is each text's own)."""
    import torch

    texts = [t for t in a if t in b]
    x = torch.nn.functional.normalize(torch.tensor([a[t] for t in texts]), dim=-1)
    y = torch.nn.functional.normalize(torch.tensor([b[t] for t in texts]), dim=-1)
    cos = x @ y.T
    same = cos.diagonal()
    other = cos[~torch.eye(len(texts), dtype=torch.bool)]
    centered = torch.nn.functional.cosine_similarity(x - x.mean(0), y - y.mean(0), dim=-1)
    return {"texts": len(texts), "same_min": same.min().item(), "same_median": same.median().item(),
            "other_median": other.median().item(), "centered_min": centered.min().item()}


def summary(entry: dict[str, Any], active: list[Contender], log: Callable[[str], None]) -> None:
    """Texts/s and the ratios, and each of ours against llama-server f32's vectors, into
    ``entry`` and the log."""
    contenders = entry["contenders"]
    speed = {k: c["median"]["texts_per_s"] for k, c in contenders.items()}
    for key, c in contenders.items():
        log(f"  {c['label']:<34} {speed[key]:8.1f} texts/s (median of {len(c['runs'])})")
    peers = {p.name: p for p in active if isinstance(p, EmbeddingsPeer)}
    ratios, cosines = {}, {}
    for name, _, _ in OURS:
        for _, llama in LLAMA:
            if name in speed and llama in speed:
                ratios[f"{name}/{llama}"] = speed[name] / speed[llama]
                log(f"  {contenders[name]['label']} / {contenders[llama]['label']}: {ratios[f'{name}/{llama}']:.2f}x")
        if name in peers and "embed_llama_f32" in peers:
            cosines[name] = agreement(peers[name].vectors, peers["embed_llama_f32"].vectors)
            c = cosines[name]
            log(f"  cosine {contenders[name]['label']} vs llama-server f32, same text: min {c['same_min']:.4f}, "
                f"median {c['same_median']:.4f}; different texts: median {c['other_median']:.4f}; same text, "
                f"less the mean vector: min {c['centered_min']:.4f}")
    best = min((v for k, v in ratios.items() if k.startswith("embed_ours/")), default=None)
    if best is not None:
        log(f"  [{'met' if best >= TARGET else 'MISSED':^6}] embeddings of {TEXTS} texts: ours (dtype auto) >= "
            f"{TARGET:g} x llama-server's texts/s (its faster GGUF): {best:.2f}")
    entry.update(ratios=ratios, cosine=cosines)


def measure(cfg: BenchConfig, log: Callable[[str], None], threads: int) -> dict[str, Any]:
    """The batch over every contender, round-robin; the ratios and the vectors' agreement."""
    model = model_dir(cfg, log)
    log(f"\n[k] embeddings ({model}, {threads} threads): a batch of {TEXTS} texts, ours against "
        "llama-server --embedding --pooling mean")
    cfg.out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    active = ours(cfg, log, model, threads, notes) + theirs(cfg, log, model, threads, notes)
    load = workload()
    try:
        entry = {**load.describe(), "model": model, "notes": notes,
                 "contenders": measure_rounds(load, active, cfg.repeats if cfg.quick else max(cfg.repeats, 3), log)}
        summary(entry, active, log)
    finally:
        for c in active:
            c.close()
    for note in notes:
        log(f"  note: {note}")
    return {"embeddings": entry}
