"""``jupyter infer bench``: its pieces, and a ``--quick`` run end to end (no speed asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cpu
from benchmarks.__main__ import main as peer_bench
from jupyter_infer.commands.bench import structured
from jupyter_infer.commands.bench import workloads as wl
from jupyter_infer.commands.bench.report import evaluate_targets, format_tables, format_targets
from jupyter_infer.commands.cli import main

CONTENDERS = ("sequential", "static", "window", "continuous", "hf_cb", "ceiling")
LABELS = ("sequential generate", "static batch (padded generate)", "ours: window", "ours: continuous",
          "transformers continuous batching", "ceiling (bare decode steps)", "ours over HTTP+SSE",
          "ours over HTTP (OpenAI completions)", "transformers serve --continuous-batching",
          "ours: prefix cache", "ours: no prefix cache", "ours: chunked prefill", "ours: whole prefill")


def words(text: str) -> int:
    return len(text.split())


def test_workloads_match_the_issue() -> None:
    burst = wl.burst(words, 16, 32)
    assert burst.closed and len(burst.arrivals) == 16 and burst.total_tokens == 16 * 32
    assert all(18 <= words(a.prompt) <= 22 for a in burst.arrivals)
    mixed = wl.mixed(words, 32)
    assert [a.max_tokens for a in mixed.arrivals[:5]] == [8, 16, 32, 64, 8]
    open_ = wl.open_loop(words, 20, rate=4.0, seed=1)
    assert not open_.closed
    assert open_.arrivals == wl.open_loop(words, 20, rate=4.0, seed=1).arrivals


def test_agents_share_a_system_prompt_and_grow_their_histories() -> None:
    agents = wl.agents(words, k=8, system_tokens=500, new_tokens=32)
    assert len(agents.chains) == 8 and all(len(c) == 3 for c in agents.chains)
    assert not agents.closed and len(agents.requests) == 24 and agents.total_tokens == 24 * 32
    system = agents.chains[0][0].prompt.split("\n\nAgent")[0]
    assert 495 <= words(system) <= 500
    for chain in agents.chains:
        assert all(a.prompt.startswith(system) for a in chain)
        # Each round's prompt is the previous one plus its answer (and the tool result).
        assert all(b.prompt.startswith(a.prompt) for a, b in zip(chain, chain[1:], strict=False))
    assert "Tool result:" in agents.chains[0][2].prompt and "Tool result:" not in agents.chains[0][1].prompt
    assert len({c[0].prompt for c in agents.chains}) == 8


def test_interference_sends_a_long_prompt_once_the_streams_run() -> None:
    w = wl.interference(words, streams=4, stream_tokens=64, long_tokens=800, after=4)
    assert [a.max_tokens for a in w.arrivals] == [64] * 4 and w.late_after == 4
    assert 790 <= words(w.late.prompt) <= 800 and w.requests[-1] is w.late


def test_the_lengths_workload_puts_one_long_prompt_beside_short_ones() -> None:
    w = wl.lengths(words, shorts=15, long_tokens=900, new_tokens=64)
    assert w.closed and len(w.arrivals) == 16 and w.total_tokens == 16 * 64
    assert 890 <= words(w.arrivals[0].prompt) <= 900 and all(words(a.prompt) <= 22 for a in w.arrivals[1:])


def _results(**medians: dict) -> dict:
    return {"workloads": {
        name: {"description": name, "contenders": {
            key: {"label": key, "median": m} for key, m in contenders.items()
        }} for name, contenders in medians.items()
    }}


def test_targets_are_ratios_within_the_run() -> None:
    results = _results(
        burst={"continuous": {"tokens_per_s": 95.0}, "ceiling": {"tokens_per_s": 100.0},
               "sequential": {"tokens_per_s": 20.0}},
        open={"continuous": {"ttft_p50_ms": 30.0}, "window": {"ttft_p50_ms": 100.0}},
    )
    by_text = {t["target"]: t for t in evaluate_targets(results)}
    ceiling = next(t for k, t in by_text.items() if "ceiling" in k)
    assert ceiling["ratio"] == pytest.approx(0.95) and ceiling["met"] is True
    sequential = next(t for k, t in by_text.items() if "sequential" in k)
    assert sequential["ratio"] == pytest.approx(4.75) and sequential["met"] is False
    ttft = next(t for k, t in by_text.items() if "TTFT" in k)
    assert ttft["ratio"] == pytest.approx(0.3) and ttft["met"] is False
    assert all(t["met"] is None for t in evaluate_targets(results) if t["workload"] in ("mixed", "http"))
    text = format_targets(results)
    assert "MISSED" in text and "met" in text and "did not measure" in text  # mixed, http: none of theirs ran
    assert "x seq" in format_tables(results)


# A stand-in for llama.cpp's convert_hf_to_gguf.py: the two places our models trip it up.
FAKE_BASE = """
import json
import re
from pathlib import Path

class ModelBase:
    @staticmethod
    def load_hparams(dir_model, is_mistral_format=False):
        return json.loads((Path(dir_model) / "config.json").read_text())

class TextModel(ModelBase):
    def get_vocab_base_pre(self, tokenizer):
        raise NotImplementedError("BPE pre-tokenizer was not recognized")
"""
FAKE_MAIN = """
import argparse, json
from pathlib import Path

class GPT2Model(TextModel):
    def __init__(self, dir_model):
        self.hparams = ModelBase.load_hparams(Path(dir_model), False)

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--outfile")
    parser.add_argument("--outtype")
    args = parser.parse_args()
    model = GPT2Model(args.model)
    Path(args.outfile).write_text(json.dumps({"n_ctx": model.hparams["n_ctx"], "outtype": args.outtype,
                                              "pre": model.get_vocab_base_pre(None)}))
"""


@pytest.mark.parametrize("layout", ["one script", "conversion package"])
def test_the_gguf_converter_learns_our_models(tmp_path: Path, layout: str) -> None:
    llama = tmp_path / "llama.cpp"
    llama.mkdir()
    if layout == "one script":  # older llama.cpp: every class in convert_hf_to_gguf.py
        (llama / "convert_hf_to_gguf.py").write_text(FAKE_BASE + FAKE_MAIN)
    else:  # newer: the base classes in conversion/base.py
        (llama / "conversion").mkdir()
        (llama / "conversion" / "__init__.py").write_text("")
        (llama / "conversion" / "base.py").write_text(FAKE_BASE)
        (llama / "convert_hf_to_gguf.py").write_text(
            "from conversion import base\nModelBase = base.ModelBase\n"
            + FAKE_MAIN.replace("(TextModel)", "(base.TextModel)"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 512}))
    assert cpu.gguf_path(str(model), "f16", None, print) is None  # no converter, no GGUF: a note, not an error
    gguf = cpu.gguf_path(str(model), "f16", str(llama / "convert_hf_to_gguf.py"), print)
    assert gguf == model / "model-f16.gguf"
    assert json.loads(gguf.read_text()) == {"n_ctx": 512, "outtype": "f16", "pre": "gpt-2"}


# ``--quick`` end to end, a group of workloads a test (one run of them all came within a few
# seconds of its test's timeout on a 2-core machine): each group's labels, its workloads'
# contenders and numbers, and every target it can judge judged.
GROUPS = {
    "batching": ("burst", "mixed", "open", "http"),
    "scheduling": ("agents", "interference", "lengths", "users", "peak"),
    "cpu": ("cpu",),
    "real_size": ("real_size",),
    "embeddings": ("embeddings",),
}


def quick_bench(model: Path, out_dir: Path, capsys: pytest.CaptureFixture[str], group: str) -> tuple[str, dict]:
    code = peer_bench(["--quick", "--model", str(model), "--out", str(out_dir), "--only", *GROUPS[group]])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Targets" in out
    assert (out_dir / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return out, json.loads((out_dir / "results.json").read_text())


def judged(results: dict, prefixes: tuple[str, ...]) -> list[dict]:
    """The targets this run could judge (the workloads it measured), each with its ratio."""
    mine = [t for t in results["targets"] if t["workload"].startswith(prefixes)]
    assert all(t["ratio"] is not None for t in mine), [t for t in mine if t["ratio"] is None]
    return mine


@pytest.mark.slow
def test_bench_quick_batching_runs_every_contender(tiny_model_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out, results = quick_bench(tiny_model_dir, tmp_path / "bench", capsys, "batching")
    for label in LABELS[:9]:
        assert label in out, label
    workloads = results["workloads"]
    assert set(CONTENDERS) <= set(workloads["burst"]["contenders"])
    assert set(CONTENDERS) <= set(workloads["mixed"]["contenders"])
    assert {"window", "continuous", "hf_cb"} <= set(workloads["open"]["contenders"])
    assert {"http", "http_openai", "hf_serve"} <= set(workloads["http"]["contenders"]), workloads["http"]
    for name in ("burst", "mixed"):
        for key in CONTENDERS:
            median = workloads[name]["contenders"][key]["median"]
            assert median["tokens_per_s"] > 0, (name, key)
            if key != "ceiling":  # every contender generated exactly the tokens asked for
                assert median["tokens"] == workloads[name]["total_new_tokens"], (name, key)
    assert judged(results, ("burst", "mixed", "open", "http"))


@pytest.mark.slow
def test_bench_quick_scheduling_runs_every_contender(tiny_model_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out, results = quick_bench(tiny_model_dir, tmp_path / "bench", capsys, "scheduling")
    for label in LABELS[9:]:
        assert label in out, label
    workloads = results["workloads"]
    assert {"continuous", "no_cache", "hf_cb"} <= set(workloads["agents"]["contenders"])
    agents = workloads["agents"]["contenders"]
    assert agents["continuous"]["median"]["prefix_reused_tokens"] > 0
    for key in ("continuous", "no_cache", "hf_cb"):  # every round of every agent answered in full
        assert agents[key]["median"]["tokens"] == workloads["agents"]["total_new_tokens"], key
    interference = workloads["interference"]["contenders"]
    assert {"continuous", "no_chunk", "standalone"} <= set(interference)
    for key in ("continuous", "no_chunk"):
        median = interference[key]["median"]
        assert median["worst_gap_ms"] >= median["itl_p99_ms"] > 0 and median["long_ttft_ms"] > 0, key
    # [h]: the long prompt beside short ones, against as many short rows plus its prefill alone;
    # both answer every token, and the KV memory held is at least what the tokens need.
    lengths = workloads["lengths"]["contenders"]
    assert {"continuous", "apart"} <= set(lengths)
    for key in ("continuous", "apart"):
        median = lengths[key]["median"]
        assert median["tokens"] == workloads["lengths"]["total_new_tokens"], key
        assert median["kv_peak_bytes"] >= median["kv_peak_needed_bytes"] > 0, key
    assert lengths["continuous"]["median"]["kv_peak_needed_bytes"] > lengths["apart"]["median"]["kv_peak_needed_bytes"]
    # [j]: B's requests came while A's burst ran; with fair share some of A's rows were parked
    # for them, and B waited less than behind the burst (FIFO).
    users = workloads["users"]["contenders"]
    assert {"fair", "fifo", "idle"} <= set(users)
    assert users["fair"]["median"]["b_during_burst"] == 3
    assert users["fair"]["median"]["parked_rows"] >= 1 and users["fifo"]["median"]["parked_rows"] == 0
    assert users["fair"]["median"]["ttft_p50_ms"] < users["fifo"]["median"]["ttft_p50_ms"]
    # [p]: beside the linears, a prompt's attention on each path (ours, our float32 kernel, SDPA).
    attention = results["peak"]["attention"]
    assert set(attention) == {"ours", "ours_f32", "sdpa"} and all(r > 0 for p in attention.values() for r in p.values())
    assert "ours_f32" in out and "attention" in out
    assert judged(results, GROUPS["scheduling"])


@pytest.mark.slow
def test_bench_quick_cpu_runs_every_kernel(tiny_model_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out, results = quick_bench(tiny_model_dir, tmp_path / "bench", capsys, "cpu")
    workloads = results["workloads"]
    # [g]: our servers by linear kernels and precision, each answering every token asked for
    # (EOS ignored) one request at a time and in a burst; llama-server only where there is one.
    for name in ("cpu_burst", "cpu_alone", "cpu_copy"):
        cpu = workloads[name]["contenders"]
        assert {"f32_eager", "f32", "f32_nospec"} <= set(cpu), cpu
        for key, entry in cpu.items():
            assert entry["median"]["tokens"] == workloads[name]["total_new_tokens"], (name, key)
    alone = workloads["cpu_alone"]["contenders"]["f32"]["median"]
    # One after the other, not together: the wall time holds at least the longest and the median
    # request back to back (all at once, it would be about the longest alone).
    assert alone["wall_s"] * 1000 >= 0.95 * (alone["latency_p99_ms"] + alone["latency_p50_ms"])
    # Speculation: on the copy-heavy prompts ours guessed, and answered the same tokens as without.
    copy = workloads["cpu_copy"]["contenders"]
    assert copy["f32"]["median"]["tokens"] == copy["f32_nospec"]["median"]["tokens"]
    quality = results["cpu_quality"]
    assert quality["f32"]["agreement"] >= 0.99 and quality["int8" if "int8" in quality else "f32"]["agreement"] >= 0.9
    assert "greedy agreement" in out


@pytest.mark.slow
def test_bench_quick_real_size_serves_every_format(tiny_model_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, results = quick_bench(tiny_model_dir, tmp_path / "bench", capsys, "real_size")
    workloads = results["workloads"]
    # [g] at a real size (the quick run: llama-tiny): ours f32, int8 and int4 (and bf16 where
    # the CPU has bf16 instructions) served the same tokens, and each server's memory was read.
    from jupyter_infer.formats.device_choice import cpu_has_native_bf16

    ours = ("real_f32", "real_int8", "real_int4", *(("real_bf16",) if cpu_has_native_bf16() else ()))
    for name in ("real_alone", "real_burst"):
        real = workloads[name]["contenders"]
        assert {*ours, "real_int4_spec"} <= set(real), name
        tokens = {real[k]["median"]["tokens"] for k in ours}
        assert tokens == {workloads[name]["total_new_tokens"]}, name
        assert all(0 < real[k]["median"]["rss_mb"] <= real[k]["median"]["peak_rss_mb"] for k in real), name


@pytest.mark.slow
def test_bench_quick_embeddings_embeds_the_batch(tiny_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out, results = quick_bench(tiny_model_dir, tmp_path / "bench", capsys, "embeddings")
    # [k]: one request of 64 texts to ours (a tiny BERT in the quick run); llama-server only
    # where there is one and a GGUF (else a note, not an error).
    entry = results["workloads"]["embeddings"]
    ours = entry["contenders"]["embed_ours"]["median"]
    assert ours["texts"] == 64 and ours["texts_per_s"] > 0 and ours["tokens"] > 64
    assert "texts/s" in out
    if "embed_llama_f32" in entry["contenders"]:
        assert entry["cosine"]["embed_ours"]["same_median"] > 0.99
    else:
        assert any("llama-server f32" in note for note in entry["notes"])


@pytest.mark.slow
def test_jupyter_infer_bench_measures_ours_and_leaves_the_others_to_the_repository(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The wheel's bench runs our contenders and our ceiling; the other servers and libraries
    (and their options) are benchmarks/' (``python -m benchmarks``)."""
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--llama-server" not in capsys.readouterr().out
    out_dir = tmp_path / "ours"
    assert main(["bench", "--quick", "--only", "burst", "mixed", "--model", str(tiny_model_dir),
                 "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    workloads = json.loads((out_dir / "results.json").read_text())["workloads"]
    for name in ("burst", "mixed"):
        assert set(workloads[name]["contenders"]) == {"window", "continuous", "ceiling"}, name
    assert "met" in out and "python -m benchmarks" in out and "not measured" not in out


def test_structured_pieces_rename_validate_and_pick_finished_answers() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a"], "additionalProperties": False}
    fresh = structured.renamed(schema, 7)
    assert list(fresh["properties"]) == ["a_7", "b"] and fresh["required"] == ["a_7"]
    assert structured.renamed({"type": "integer"}, 7) != {"type": "integer"}  # no properties: a title
    assert structured.validates('{"a":1}', schema) and not structured.validates('{"a":"x"}', schema)
    assert not structured.validates('{"a":1', schema)  # not JSON
    dt = {"type": "string", "format": "date-time"}
    assert structured.validates('"2026-12-01T10:11:12Z"', dt) and not structured.validates('"2026-12-01T10:11:60Z"', dt)
    names = [n for n, _ in structured.corpus()]
    answers = [structured.Answer(n, "stop" if i % 2 else "length", "{}", 10 + i, 1.0, 2.0) for i, n in enumerate(names[:6])]
    burst, chosen = structured.burst_workload(answers, [f"p{i}" for i in range(6)], 4)
    assert [n for n, _ in chosen] == [names[1], names[3], names[5], names[1]]  # finished ones, cycled
    assert [a.max_tokens for a in burst.arrivals] == [11, 13, 15, 11] and burst.arrivals[0].prompt == "p1"


# An llguidance looseness, not the bench's: its date-time format lets the seconds be 60 at any
# minute, which jsonschema's checker and pydantic's datetime refuse (RFC 3339 allows 60 only for
# a leap second). Fixed where the constraint is compiled (constraints/grammar.py), this goes.


@pytest.mark.slow
def test_bench_quick_structured(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "bench"
    code = main(["bench", "--quick", "--only", "structured", "--model", str(tiny_model_dir), "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[i] structured, validity" in out and "[i] structured, 16 streams" in out
    workloads = json.loads((out_dir / "results.json").read_text())["workloads"]
    assert set(workloads) == {"structured_corpus", "structured_burst", "structured_sampled", "structured_alone"}
    corpus = workloads["structured_corpus"]
    median = corpus["contenders"]["corpus"]["median"]
    assert median["answers"] == len(structured.corpus()) == len(corpus["answers"])
    assert median["finished"] + median["length"] + median["refused"] == median["answers"]
    assert median["finished"] >= 16 and median["refused"] == 0
    burst = workloads["structured_burst"]["contenders"]
    assert set(burst) == {"unconstrained_mean", "unconstrained", "no_ff", "ff"}
    for key, entry in burst.items():
        m = entry["median"]
        assert m["tokens_per_s"] > 0 and m["tokens"] > 0 and m["steps"] > 0, key
        if key in ("no_ff", "ff"):  # every constrained stream ends with its grammar
            assert m["finished"] == 16, key
    assert burst["ff"]["median"]["forced_share"] > 0 and burst["no_ff"]["median"]["forced_share"] == 0
    assert burst["ff"]["median"]["steps"] < burst["no_ff"]["median"]["steps"]
    assert burst["unconstrained"]["median"]["tokens"] == workloads["structured_burst"]["total_new_tokens"]
    # Sampled (issue 31): the seeded constrained answers are as long every pass, so their
    # unconstrained twins generate the same tokens; every finished constrained answer is valid
    # (a sampled one may run to max_tokens: a random model draws long strings).
    sampled = workloads["structured_sampled"]["contenders"]
    assert set(sampled) == {"unconstrained", "ff"}
    m = sampled["ff"]["median"]
    assert m["finished"] + m["length"] == 16 and m["finished"] >= 8 and m["valid"] == m["finished"]
    assert sampled["ff"]["median"]["tokens"] == sampled["unconstrained"]["median"]["tokens"] \
        == workloads["structured_sampled"]["total_new_tokens"]
    assert "structured, sampled: constrained + fast-forward >= 0.9 x unconstrained" in out
    alone = workloads["structured_alone"]["contenders"]
    assert {"unconstrained", "new_schema"} == set(alone)
    assert alone["new_schema"]["median"]["compiled"] > median["answers"]  # a new compile each
    assert alone["new_schema"]["median"]["compile_ms_p50"] > 0
    # Validity: every finished answer parses and validates against its schema.
    schemas = dict(structured.corpus())
    for a in corpus["answers"]:
        if a["finish_reason"] == "stop":
            assert a["valid"] == structured.validates(a["text"], schemas[a["schema"]]), a
    # Once a date-time with seconds 60 (llguidance's leap second at any minute); no longer.
    invalid = [a for a in corpus["answers"] if a["finish_reason"] == "stop" and not a["valid"]]
    assert not invalid, invalid


def test_the_noise_gauge_counts_the_server_under_test_as_its_own() -> None:
    """[g] and [d] measure servers in other processes: their CPU is not "other processes"."""
    import subprocess
    import sys
    import time

    from jupyter_infer.commands.bench.rounds import _cpu_sample, _other_cpu_share

    server = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    try:
        time.sleep(0.3)  # it runs
        before_own, before_all = _cpu_sample([server.pid]), _cpu_sample()
        time.sleep(0.8)
        own, anyone = _other_cpu_share(before_own, _cpu_sample([server.pid])), _other_cpu_share(before_all, _cpu_sample())
    finally:
        server.wait()
    assert own is not None and anyone is not None
    assert anyone - own > 0.2  # one busy core of the machine's, now counted as the contender's


def test_one_at_a_time_prompts_are_new_every_round_and_the_same_for_every_contender() -> None:
    """A server that remembers what it saw across requests (llama-server's ngram-mod keeps its
    n-gram table) must not be timed on answers it has seen: the warm-up and every round of the
    one-at-a-time workloads send new prompts, the same to every contender in a round."""
    from benchmarks.cpu import workloads
    from jupyter_infer.commands.bench.contenders import Contender, Run
    from jupyter_infer.commands.bench.rounds import measure_rounds

    class Recorder(Contender):
        def __init__(self, name: str) -> None:
            self.name = self.label = name
            self.seen: list[list[str]] = []

        def run(self, workload) -> Run:
            self.seen.append([a.prompt for a in workload.requests])
            return Run(wall_s=1.0, tokens=1)

    count = lambda text: len(text.split())  # noqa: E731
    for load in workloads(count, (4, 8), (3, 8), (3, (60, 120), 16))[1:]:
        a, b = Recorder("a"), Recorder("b")
        measure_rounds(load, [a, b], repeats=3, log=lambda line: None)
        assert a.seen == b.seen  # warm-up and 3 rounds, round-robin: the same prompts for both
        rounds = [tuple(p) for p in a.seen]
        assert len(set(rounds)) == 4, load.name  # the warm-up's and each round's are new
        assert not set(rounds[0]) & set(rounds[1]), load.name  # no prompt sent twice


def test_a_token_reads_every_weight_but_the_input_embedding_unless_the_head_is_tied(tmp_path: Path) -> None:
    """The ladder's read-bandwidth share (issue 58): bytes a decode token reads, from a GGUF."""
    import gguf
    import numpy as np

    from benchmarks.memory_bound import bytes_per_token, share

    def write(path: Path, tied: bool) -> Path:
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_tensor("token_embd.weight", np.ones((64, 32), np.float32))
        writer.add_tensor("blk.0.attn_q.weight", np.ones((32, 32), np.float32))
        writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
        if not tied:
            writer.add_tensor("output.weight", np.ones((64, 32), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    untied, tied = write(tmp_path / "untied.gguf", False), write(tmp_path / "tied.gguf", True)
    # untied: the layer's matrix and norm, and the head; the input table is one row a token
    assert bytes_per_token(untied) == (32 * 32 + 32 + 64 * 32) * 4
    # tied: the head is the embedding table, read whole
    assert bytes_per_token(tied) == (64 * 32 + 32 * 32 + 32) * 4
    # our int4 over the same shapes: 18 bytes a group of 32 weights, float32 norms
    assert bytes_per_token(untied, "int4") == (32 * 32 + 64 * 32) * 18 // 32 + 32 * 4
    assert share(10.0, 10**9, 20.0) == 0.5 and share(None, 10**9, 20.0) is None


def test_the_ladder_says_how_each_llama_cpp_was_built(tmp_path: Path) -> None:
    """A peer's build is named with its instruction sets and its own compiler flags: a build with
    -march=native but AMX switched off (a VM that advertises AMX and faults on it) must not read
    as a plain AVX2 build."""
    from benchmarks.ladder import llama_build

    exe = tmp_path / "build" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 'version: 1 (abc)'\n")
    exe.chmod(0o755)
    (tmp_path / "build" / "CMakeCache.txt").write_text(
        "GGML_NATIVE:BOOL=OFF\nGGML_AVX2:BOOL=ON\nGGML_CUDA:BOOL=ON\n"
        "CMAKE_C_FLAGS:STRING=-march=native -mno-amx-tile\n")
    said = llama_build(str(exe))
    assert said.startswith("version: 1 (abc);")
    assert "GGML_NATIVE=OFF, GGML_AVX2 on" in said and "GGML_CUDA" not in said
    assert "CMAKE_C_FLAGS -march=native -mno-amx-tile" in said


def test_the_ladder_table_prints_each_one_streams_share_and_the_ik_llama_cpp_pair() -> None:
    from benchmarks.ladder import table

    entry = {"model": "m", "llama_build": "b", "ik_llama_build": "ik b", "read_gbs": 25.0, "contenders": {
        "ours_int4": {"label": "ours int4", "ready_s": [40.0, 8.0], "one_stream_tok_s": 27.0, "read_share": 0.8},
        "ik_q4_0": {"label": "ik_llama.cpp q4_0 -rtr", "ready_s": [2.0], "one_stream_tok_s": 18.0, "read_share": 0.53}}}
    lines = table("1.5b", entry, (1024,)).splitlines()
    assert any("ik_llama.cpp: ik b" in line for line in lines) and any("25.0 GB/s" in line for line in lines)
    ours = next(line for line in lines if line.strip().startswith("ours int4 ") and "/ ik" not in line)
    assert "80%" in ours.split()
    pair = next(line for line in lines if "ours int4 / ik_llama.cpp q4_0 -rtr" in line)
    assert "4.00" in pair.split() and "1.50" in pair.split()  # second start 8/2, one stream 27/18
