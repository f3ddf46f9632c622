"""llguidance against xgrammar on our schema corpus (issue 19): which grammar library to use.

For each library, on one tokenizer: compile time per schema (a fresh compiler each time, no
cache), the first mask after compiling (llguidance builds its lexer lazily, so compile time
alone flatters it), mask time per token over a short deterministic walk (at each step the
lowest-id allowed token that is not EOS, unless only EOS is allowed), and coverage (schemas
compiled without error). The hostile cases run one per subprocess under a wall-clock limit,
counted from when the child is ready (imports and tokenizer loaded).

``python -m benchmarks.grammar_libs [--json out.json]`` (tiny, small, a 32k-token BPE);
the results and the choice: ``docs/structured-outputs.md``, "Grammar library choice (measured)".
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from jupyter_infer.commands.bench.schemas import corpus, hostile

LIBS = ("llguidance", "xgrammar", "xgrammar-strict")
HOSTILE_LIBS = ("llguidance", "xgrammar")
WALK_TOKENS = 64
REPEATS = 3  # per schema; the least time of each is kept
HOSTILE_WALK_TOKENS = 10
HOSTILE_LIMIT_S = 10.0
CHILD_MEMORY_BYTES = 12 << 30  # a hostile case that wants more is refused by the kernel


class Refused(Exception):
    """The library rejected the schema (at compile time or at a mask)."""


def _schema_text(schema: Any) -> str:
    # A str is passed through as schema text (so "string" is not JSON); anything else is dumped.
    return schema if isinstance(schema, str) else json.dumps(schema)


class LLGuidance:
    name = "llguidance"

    def __init__(self, hf_tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self._ll, self._np = llguidance, llguidance.numpy
        self.tok = llguidance.hf.from_tokenizer(hf_tokenizer)
        self.vocab, self.eos = self.tok.vocab_size, {self.tok.eos_token}
        self.mask = llguidance.numpy.allocate_token_bitmask(1, self.vocab)  # int32 words

    def compile(self, schema: Any) -> tuple[Any, float]:
        matcher_cls = self._ll.LLMatcher
        t0 = time.perf_counter()
        try:
            grammar = matcher_cls.grammar_from_json_schema(
                _schema_text(schema), defaults={"whitespace_flexible": False})
        except ValueError as e:
            raise Refused(str(e)) from None
        matcher = matcher_cls(self.tok, grammar, log_level=0)
        seconds = time.perf_counter() - t0
        if matcher.is_error():
            raise Refused(matcher.get_error())
        return matcher, seconds

    def fill(self, matcher: Any) -> None:
        self._np.fill_next_token_bitmask(matcher, self.mask)
        if matcher.is_error():
            raise Refused(matcher.get_error())

    def consume(self, matcher: Any, token: int) -> bool:
        if not matcher.consume_token(token) and matcher.is_error():
            raise Refused(matcher.get_error())
        return True


class XGrammar:
    name, strict = "xgrammar", False

    def __init__(self, hf_tokenizer: Any) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=len(hf_tokenizer))
        # Out of the box, xgrammar decodes added special tokens (our role markers) to their text
        # and lets them into JSON strings; an empty encoding is how it recognises a special token.
        specials = set(hf_tokenizer.all_special_ids)
        by_id = sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        encoded = ["" if i in specials else tok for tok, i in by_id]
        self.info = xgrammar.TokenizerInfo(encoded, info.vocab_type, vocab_size=len(hf_tokenizer),
                                           stop_token_ids=info.stop_token_ids, add_prefix_space=info.add_prefix_space)
        self.vocab, self.eos = self.info.vocab_size, set(self.info.stop_token_ids)
        self.buf = xgrammar.allocate_token_bitmask(1, self.vocab)
        self.mask = self.buf.numpy()  # the same memory

    def compile(self, schema: Any) -> tuple[Any, float]:
        compiler = self._xgr.GrammarCompiler(self.info, cache_enabled=False, max_threads=os.cpu_count() or 1)
        t0 = time.perf_counter()
        try:
            # Compact separators, and by default the spec's additionalProperties as llguidance
            # has it (xgrammar's own default, strict_mode, forbids what the schema leaves open).
            compiled = compiler.compile_json_schema(_schema_text(schema), any_whitespace=False,
                                                    separators=(",", ":"), strict_mode=self.strict)
            matcher = self._xgr.GrammarMatcher(compiled)
        except (RuntimeError, ValueError, TypeError) as e:
            # "[hh:mm:ss] /project/cpp/file.cc:123: Check failed: (...) is false: message"
            raise Refused(re.sub(r"^\[[\d:]+\] \S+: (Check failed: .*? is false: )?", "", str(e).strip())) from None
        return matcher, time.perf_counter() - t0

    def fill(self, matcher: Any) -> None:
        matcher.fill_next_token_bitmask(self.buf)

    def consume(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)


class XGrammarStrict(XGrammar):
    """xgrammar's default strict_mode: no properties or items the schema does not name."""

    name, strict = "xgrammar-strict", True


ADAPTERS = {"llguidance": LLGuidance, "xgrammar": XGrammar, "xgrammar-strict": XGrammarStrict}


def allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    """The token ids a bitmask (int32 words, bit i of word w is token 32 w + i) allows."""
    bits = np.unpackbits(np.ascontiguousarray(mask).reshape(-1).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab])


def walk(lib: Any, matcher: Any, steps: int) -> dict:
    """Mask, pick, consume, ``steps`` times; the mask times (s), tokens and how it ended."""
    times, tokens = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        lib.fill(matcher)
        times.append(time.perf_counter() - t0)
        ids = allowed(lib.mask, lib.vocab)
        if ids.size == 0:
            return {"mask_s": times, "tokens": tokens, "end": "empty mask"}
        rest = ids[~np.isin(ids, list(lib.eos))]
        token = int(rest[0]) if rest.size else int(ids[0])
        if not lib.consume(matcher, token):
            return {"mask_s": times, "tokens": tokens, "end": "token rejected"}
        tokens.append(token)
        if not rest.size:
            return {"mask_s": times, "tokens": tokens, "end": "eos"}
    return {"mask_s": times, "tokens": tokens, "end": "steps"}


def run_schema(lib: Any, schema: Any, steps: int) -> dict:
    compile_s = None
    try:
        matcher, compile_s = lib.compile(schema)
        return {"ok": True, "compile_s": compile_s, **walk(lib, matcher, steps)}
    except Refused as e:
        return {"ok": False, "stage": "compile" if compile_s is None else "walk", "compile_s": compile_s,
                "error": str(e).strip().splitlines()[0][:200]}


def _stats(values: list[float], scale: float) -> dict:
    """p50, p99 and max of ``values`` times ``scale`` (None when there are none)."""
    pick = {"p50": 50, "p99": 99, "max": 100}
    return {k: float(np.percentile(values, q)) * scale if values else None for k, q in pick.items()}


def _top(values: dict[str, float], n: int = 5) -> dict[str, float]:
    return dict(sorted(values.items(), key=lambda kv: -kv[1])[:n])


def best_of(lib: Any, schema: Any, steps: int, repeats: int) -> dict:
    """``run_schema`` ``repeats`` times; the least compile time and, step by step, the least mask
    time (the walk is deterministic, so step i is the same state in every run): what the
    library costs, without the preemptions of a shared machine."""
    runs = [run_schema(lib, schema, steps) for _ in range(repeats)]
    if not all(r["ok"] for r in runs):
        return next(r for r in runs if not r["ok"])
    best = dict(runs[0], compile_s=min(r["compile_s"] for r in runs))
    best["mask_s"] = [min(col) for col in zip(*(r["mask_s"] for r in runs), strict=True)]
    return best


def measure_lib(lib: Any, schemas: list[tuple[str, Any]], steps: int = WALK_TOKENS, repeats: int = REPEATS) -> dict:
    run_schema(lib, {"type": "object", "properties": {"w": {"type": "integer"}}}, 2)  # warm-up
    per_schema = {name: best_of(lib, schema, steps, repeats) for name, schema in schemas}
    ok = [r for r in per_schema.values() if r["ok"]]
    compile_s = [r["compile_s"] for r in ok]
    first_s = [r["compile_s"] + r["mask_s"][0] for r in ok]
    mask_s = [t for r in ok for t in r["mask_s"][1:]]
    ends: dict[str, int] = {}
    for r in ok:
        ends[r["end"]] = ends.get(r["end"], 0) + 1
    return {
        "compiled": len(ok), "schemas": len(schemas),
        "failed": {n: r["error"] for n, r in per_schema.items() if not r["ok"]},
        "compile_ms": _stats(compile_s, 1e3),
        "first_mask_ms": _stats(first_s, 1e3),
        "mask_us": _stats(mask_s, 1e6),
        "masks": len(mask_s), "walk_ends": ends,
        "slowest_compile_ms": _top({n: r["compile_s"] * 1e3 for n, r in per_schema.items() if r["ok"]}),
        "slowest_mask_us": _top({n: max(r["mask_s"][1:], default=0) * 1e6 for n, r in per_schema.items() if r["ok"]}),
        "tokens": {n: r.get("tokens") for n, r in per_schema.items()},
        "ends": {n: r.get("end") for n, r in per_schema.items()},
    }


# -- hostile cases, one subprocess each ------------------------------------------------------------
def _status_kb(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def _child(lib_name: str, case: str, tokenizer_dir: str) -> None:
    """Run one hostile case; print "ready" once loaded, then one JSON line."""
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
    from transformers import AutoTokenizer

    lib = ADAPTERS[lib_name](AutoTokenizer.from_pretrained(tokenizer_dir))
    schema = dict(hostile())[case]
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to the current RSS
    rss_ready = _status_kb("VmRSS")
    print("ready", flush=True)
    t0 = time.perf_counter()
    try:
        result = run_schema(lib, schema, HOSTILE_WALK_TOKENS)
    except MemoryError:
        result = {"ok": False, "stage": "memory", "error": "MemoryError"}
    result.pop("tokens", None)
    result["mask_s"] = result.get("mask_s", [])[:1]
    result["wall_s"] = time.perf_counter() - t0
    result["rss_growth_mb"] = (_status_kb("VmHWM") - rss_ready) / 1024
    print(json.dumps(result), flush=True)


def run_hostile_case(lib_name: str, case: str, tokenizer_dir: str, limit_s: float = HOSTILE_LIMIT_S) -> dict:
    """One hostile case in a child; the clock starts when the child says it is ready."""
    with tempfile.TemporaryFile("w+") as errors:
        root = str(Path(__file__).resolve().parents[1])  # the child imports benchmarks.grammar_libs
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.grammar_libs", "--child", lib_name, case, str(tokenizer_dir)],
            stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        ready = proc.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        try:
            proc.wait(timeout=limit_s if ready else 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {"status": "timed out", "wall_s": time.perf_counter() - t0}
        wall = time.perf_counter() - t0
        lines = [ln for ln in proc.stdout.read().splitlines() if ln.startswith("{")]
        proc.stdout.close()
        errors.seek(0)
        tail = (errors.read().strip().splitlines() or [""])[-1][:200]
    if proc.returncode != 0 or not lines:
        return {"status": "crashed", "rc": proc.returncode, "error": tail, "wall_s": wall}
    r = json.loads(lines[-1])
    status = "compiled" if r["ok"] else ("refused" if r["stage"] == "compile" else f"refused at {r['stage']}")
    return {"status": status, "wall_s": r["wall_s"], "compile_s": r.get("compile_s"), "error": r.get("error"),
            "end": r.get("end"), "rss_growth_mb": r["rss_growth_mb"]}


def run_hostile(lib_name: str, tokenizer_dir: str | Path, limit_s: float = HOSTILE_LIMIT_S) -> dict:
    return {case: run_hostile_case(lib_name, case, str(tokenizer_dir), limit_s) for case, _ in hostile()}


# -- the measure ----------------------------------------------------------------------------------
def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*: (.*)$", cpuinfo, re.M)
    versions = {}
    for name in ("llguidance", "xgrammar", "transformers"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": model.group(1) if model else platform.processor(), "cores": os.cpu_count(),
            "avx2": " avx2" in cpuinfo, "avx512_bf16": "avx512_bf16" in cpuinfo,
            "python": platform.python_version(), "versions": versions}


def measure(tokenizer_dir: str | Path, libs: tuple[str, ...] = LIBS, steps: int = WALK_TOKENS,
            with_hostile: bool = True) -> dict:
    """Both libraries on the corpus (and the hostile cases) with the tokenizer in ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    result: dict = {"tokenizer": str(tokenizer_dir), "vocab": len(hf), "libs": {}}
    for name in libs:
        try:
            t0 = time.perf_counter()
            lib = ADAPTERS[name](hf)
            setup_s = time.perf_counter() - t0
        except ImportError as e:
            result["libs"][name] = {"skipped": f"not importable: {e}"}
            continue
        result["libs"][name] = {"tokenizer_setup_ms": setup_s * 1e3, **measure_lib(lib, corpus(), steps)}
        if with_hostile and name in HOSTILE_LIBS:
            result["libs"][name]["hostile"] = run_hostile(name, tokenizer_dir)
    check_walks(hf, result)
    return result


def check_walks(hf: Any, result: dict) -> None:
    """Validate each walk that ended (EOS) against its schema (formats checked too), and count
    the schemas where the two libraries' texts agree (one a prefix of the other; token ids may
    differ: llguidance allows only the canonical tokens of bytes the grammar forces)."""
    import jsonschema

    schemas, texts = dict(corpus()), {}
    for name, r in result["libs"].items():
        if "tokens" not in r:
            continue
        texts[name] = {n: hf.decode([t for t in toks if t not in hf.all_special_ids])
                       for n, toks in r.pop("tokens").items() if toks is not None}
        ended = [n for n, end in r.pop("ends").items() if end == "eos"]
        invalid = {}
        for n in ended:
            try:
                validator = jsonschema.validators.validator_for(schemas[n])
                validator(schemas[n], format_checker=validator.FORMAT_CHECKER).validate(json.loads(texts[name][n]))
            except (ValueError, jsonschema.ValidationError) as e:
                invalid[n] = f"{texts[name][n][:60]!r}: {str(e).splitlines()[0][:80]}"
        r["ended_walks"], r["invalid_outputs"] = len(ended), invalid
    if "llguidance" in texts and "xgrammar" in texts:
        a, b = texts["llguidance"], texts["xgrammar"]
        apart = sorted(n for n in a if n in b and not (a[n].startswith(b[n]) or b[n].startswith(a[n])))
        result["walks_apart"] = {n: [a[n][:70], b[n][:70]] for n in apart}


def wide_tokenizer(directory: str | Path, vocab: int = 32_000) -> Path:
    """A byte-level BPE of ``vocab`` tokens trained on the Python standard library's sources
    (a vocabulary of a real model's size, built without the network; a few seconds)."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    target = Path(directory)
    if (target / "tokenizer.json").exists():
        return target
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    texts = (f.read_text(errors="ignore") for f in files[:6000])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(target)
    return target


# -- the table -----------------------------------------------------------------------------------
def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: list[dict]) -> str:
    rows = ["| tokenizer (vocab) | library | compiled | compile ms p50 / p99 / max | compile+1st mask ms p50 / p99 / max"
            " | mask µs p50 / p99 / max | tokenizer setup ms |", "|---|---|---|---|---|---|---|"]
    for res in results:
        for name, r in res["libs"].items():
            label = f"{Path(res['tokenizer']).name} ({res['vocab']})"
            if "skipped" in r:
                rows.append(f"| {label} | {name} | skipped: {r['skipped']} | | | | |")
                continue
            c, f, m = r["compile_ms"], r["first_mask_ms"], r["mask_us"]
            rows.append(f"| {label} | {name} | {r['compiled']}/{r['schemas']} | {_f(c['p50'])} / {_f(c['p99'])} / {_f(c['max'])}"
                        f" | {_f(f['p50'])} / {_f(f['p99'])} / {_f(f['max'])} | {_f(m['p50'], 1)} / {_f(m['p99'], 1)}"
                        f" / {_f(m['max'], 1)} | {_f(r['tokenizer_setup_ms'], 1)} |")
    return "\n".join(rows)


def hostile_table(res: dict) -> str:
    libs = [n for n, r in res["libs"].items() if "hostile" in r]
    rows = ["| case | " + " | ".join(libs) + " |", "|---|" + "---|" * len(libs)]
    for case, _ in hostile():
        cells = []
        for n in libs:
            h = res["libs"][n]["hostile"][case]
            cells.append(f"{h['status']}, {h['wall_s'] * 1e3:.0f} ms" + (f" (walk: {h['end']})" if h.get("end") else "")
                         + (f", +{h['rss_growth_mb']:.0f} MB" if h.get("rss_growth_mb", 0) >= 1 else "")
                         + (f": {h['error'][:70]}".replace("|", "/") if h.get("error") else ""))
        rows.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(results: list[dict]) -> str:
    """The tables and what the walks showed, as printed by ``main``."""
    out = [f"machine: {json.dumps(machine())}", table(results)]
    for res in results:
        label = Path(res["tokenizer"]).name
        for name, r in ((n, r) for n, r in res["libs"].items() if "skipped" not in r):
            out.append(f"\n{label} {name}: {r['ended_walks']} walks ended, {len(r['invalid_outputs'])} invalid: "
                       + json.dumps(r["invalid_outputs"], indent=1, ensure_ascii=False))
            out.append(f"  slowest compiles (ms): {json.dumps({k: round(v, 1) for k, v in r['slowest_compile_ms'].items()})}")
            out.append(f"  slowest masks (µs): {json.dumps({k: round(v) for k, v in r['slowest_mask_us'].items()})}")
            out += [f"  failed: {json.dumps(r['failed'])[:1500]}"] if r["failed"] else []
        if "walks_apart" in res:
            out.append(f"{label}: llguidance and xgrammar texts apart on {len(res['walks_apart'])} schemas: "
                       f"{', '.join(res['walks_apart'])} (the texts are in the JSON)")
        if any("hostile" in r for r in res["libs"].values()):
            out.append(f"\nhostile cases ({label}, limit {HOSTILE_LIMIT_S:.0f} s each):\n{hostile_table(res)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=3, metavar=("LIB", "CASE", "TOKENIZER"), help=argparse.SUPPRESS)
    p.add_argument("--sizes", nargs="*", default=["tiny", "small"], help="model_builder sizes whose tokenizer to use")
    p.add_argument("--no-wide", action="store_true", help="skip the 32k-token BPE trained on the stdlib")
    p.add_argument("--dir", default="/tmp/gl", help="where the models and the wide tokenizer are built")
    p.add_argument("--no-hostile", action="store_true")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    from jupyter_infer.commands.model_builder import make_model

    dirs = [make_model(Path(args.dir) / s, s) for s in args.sizes]
    if not args.no_wide:
        dirs.append(wide_tokenizer(Path(args.dir) / "wide-32k"))
    results = []
    for i, d in enumerate(dirs):  # the hostile cases run on the last (largest) tokenizer only
        results.append(measure(d, with_hostile=not args.no_hostile and i == len(dirs) - 1))
        print(f"measured {d}", file=sys.stderr, flush=True)
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
