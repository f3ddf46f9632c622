"""The benchmark's output: a table per workload, ratios, the issue's targets, JSON and a chart."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORDER = ("sequential", "static", "window", "continuous", "no_cache", "no_chunk", "standalone", "apart", "hf_cb", "ceiling",
         "http", "http_openai", "hf_serve", "llama_server",
         "f32_eager", "f32", "f32_nospec", "bf16", "int8", "llama_f32", "llama_f32_ngram", "llama_f16", "llama_q8_0",
         "real_f32", "real_bf16", "real_int8", "real_int4", "real_int4_spec", "real_gguf_q4_0", "real_llama_f32",
         "real_llama_f16", "real_llama_q8_0", "real_llama_q4_0",
         "real_llama_q4_K_M", "real_llama_q4_0_ngram",
         "corpus", "unconstrained_mean", "unconstrained", "no_ff", "ff", "new_schema", "fair", "fifo", "idle")
TITLES = {"burst": "[a] burst", "mixed": "[b] mixed", "open": "[c] open loop", "http": "[d] over HTTP",
          "agents": "[e] agents", "interference": "[f] interference", "lengths": "[h] mixed lengths",
          "cpu_burst": "[g] CPU, burst",
          "cpu_alone": "[g] CPU, one at a time", "cpu_copy": "[g] CPU, copy-heavy, one at a time",
          "real_alone": "[g] real size (0.5b shape), one at a time", "real_burst": "[g] real size (0.5b shape), burst",
          "structured_corpus": "[i] structured, validity", "structured_burst": "[i] structured, 16 streams",
          "structured_sampled": "[i] structured, 16 streams sampled",
          "structured_alone": "[i] structured, one at a time", "users": "[j] users (B's requests: TTFT, latency)"}
# Columns of a second table, for the workloads that measure more than throughput and TTFT.
EXTRA_COLUMNS = {
    "agents": (("wall s", "wall_s", ".2f"), ("reused tok", "prefix_reused_tokens", ".0f"), ("hits", "prefix_hits", ".0f"),
               ("KV MB", "kv_peak_mb", ".1f"), ("needed", "kv_peak_needed_mb", ".1f"), ("KV max MB", "kv_max_mb", ".1f")),
    "interference": (("worst gap", "worst_gap_ms", ".1f"), ("ITL p50", "itl_p50_ms", ".1f"),
                     ("ITL p99", "itl_p99_ms", ".1f"), ("long TTFT", "long_ttft_ms", ".1f")),
    "lengths": (("wall s", "wall_s", ".2f"), ("KV MB", "kv_peak_mb", ".1f"), ("needed", "kv_peak_needed_mb", ".1f"),
                ("KV max MB", "kv_max_mb", ".1f")),
    "structured_corpus": (("answers", "answers", ".0f"), ("finished", "finished", ".0f"), ("valid", "valid", ".0f"),
                          ("length", "length", ".0f"), ("refused", "refused", ".0f"), ("tok/answer", "tokens_per_answer", ".1f"),
                          ("ff share", "forced_share", ".2f")),
    **{w: (("tok/answer", "tokens_per_answer", ".1f"), ("steps", "steps", ".0f"),
           ("ff share", "forced_share", ".2f"), ("finished", "finished", ".0f"),
           ("valid", "valid", ".0f"), ("busy s", "engine_busy_s", ".2f")) for w in ("structured_burst", "structured_sampled")},
    **{w: (("RSS MB", "rss_mb", ".0f"), ("peak MB", "peak_rss_mb", ".0f")) for w in ("real_alone", "real_burst")},
    "users": (("A tok/s", "a_tokens_per_s", ".1f"), ("A wall s", "a_wall_s", ".2f"),
              ("B in burst", "b_during_burst", ".0f"), ("parked", "parked_rows", ".0f")),
    "structured_alone": (("compiles", "compiled", ".0f"), ("compile p50", "compile_ms_p50", ".2f"),
                         ("compile p99", "compile_ms_p99", ".2f")),
}


@dataclass(frozen=True)
class Target:
    """One of the issues' targets: ``ours``'s ``metric`` over ``other``'s ``other_metric``
    (the same metric unless given) in one workload."""

    workload: str
    text: str
    ours: str
    other: str
    metric: str
    op: str  # ">=": a ratio to reach; "<=": a ratio to stay under
    bound: float
    other_metric: str | None = None


TARGETS = (
    # issue 4
    Target("burst", "continuous >= 0.90 x the decode-step ceiling (tok/s)", "continuous", "ceiling", "tokens_per_s", ">=", 0.90),
    Target("burst", "continuous >= 5 x sequential generate (tok/s)", "continuous", "sequential", "tokens_per_s", ">=", 5.0),
    Target("mixed", "continuous >= 1.3 x one padded batch (tok/s)", "continuous", "static", "tokens_per_s", ">=", 1.3),
    Target("mixed", "continuous >= 1.2 x transformers' continuous batching (tok/s)", "continuous", "hf_cb", "tokens_per_s", ">=", 1.2),
    Target("open", "TTFT p50: continuous <= 0.25 x window", "continuous", "window", "ttft_p50_ms", "<=", 0.25),
    # issue 12
    Target("agents", "TTFT p50: prefix cache <= 0.3 x none", "continuous", "no_cache", "ttft_p50_ms", "<=", 0.3),
    Target("agents", "whole run: prefix cache <= 0.7 x none (wall time)", "continuous", "no_cache", "wall_s", "<=", 0.7),
    Target("interference", "worst stall of the streams <= 0.25 x the long prompt's prefill alone", "continuous",
           "standalone", "worst_gap_ms", "<=", 0.25, "long_ttft_ms"),
    Target("interference", "long prompt's TTFT <= 2 x its prefill alone", "continuous", "standalone",
           "long_ttft_ms", "<=", 2.0),
    # issue 18
    Target("lengths", "mixed lengths: wall <= 1.2 x (the short ones alone + the long prefill alone)", "continuous",
           "apart", "wall_s", "<=", 1.2),
    Target("lengths", "mixed lengths: KV bytes held <= 1.2 x what the tokens need (when they are most)", "continuous",
           "continuous", "kv_peak_bytes", "<=", 1.2, "kv_peak_needed_bytes"),
    Target("agents", "agents: KV bytes held <= 1.2 x what the tokens need, a shared prefix once (when they are most)",
           "continuous", "continuous", "kv_peak_bytes", "<=", 1.2, "kv_peak_needed_bytes"),
    Target("http", "over HTTP+SSE >= 0.95 x in-process (tok/s)", "http", "continuous", "tokens_per_s", ">=", 0.95),
    Target("http", "ours >= 1.3 x transformers serve (tok/s, OpenAI completions)", "http_openai", "hf_serve",
           "tokens_per_s", ">=", 1.3),
    Target("http", "TTFT p50: ours <= 0.6 x transformers serve", "http_openai", "hf_serve", "ttft_p50_ms", "<=", 0.6),
    # issue 14: each precision class against llama.cpp's counterpart, and int8 against our f32
    *(target
      for w, what in (("cpu_burst", "burst"), ("cpu_alone", "alone"))
      for a, b in (("f32", "llama_f32"), ("bf16", "llama_f16"))
      for peer in [b.removeprefix("llama_")]
      for target in (Target(w, f"{what}: ours {a} >= 0.9 x llama-server {peer} (tok/s)", a, b, "tokens_per_s",
                            ">=", 0.9),
                     Target(w, f"{what}: TTFT p50 ours {a} <= 1.2 x llama-server {peer}", a, b, "ttft_p50_ms",
                            "<=", 1.2))),
    Target("cpu_burst", "burst: int8 >= 1.3 x our f32 (tok/s)", "int8", "f32", "tokens_per_s", ">=", 1.3),
    Target("cpu_alone", "alone: int8 >= 1.3 x our f32 (tok/s)", "int8", "f32", "tokens_per_s", ">=", 1.3),
    # issue 20: speculative decoding, one request at a time
    Target("cpu_copy", "copy-heavy: ours f32 >= 1.5 x llama-server f32 (tok/s)", "f32", "llama_f32", "tokens_per_s",
           ">=", 1.5),
    Target("cpu_copy", "copy-heavy: ours f32 >= 1.0 x llama-server f32 with n-gram speculation (tok/s)", "f32",
           "llama_f32_ngram", "tokens_per_s", ">=", 1.0),
    Target("cpu_copy", "copy-heavy: TTFT p50 ours f32 <= 1.2 x llama-server f32", "f32", "llama_f32", "ttft_p50_ms",
           "<=", 1.2),
    Target("cpu_alone", "alone: ours f32 >= 1.0 x llama-server f32 (tok/s, issue 20)", "f32", "llama_f32",
           "tokens_per_s", ">=", 1.0),
    Target("cpu_alone", "alone: ours f32 >= 0.9 x llama-server f32 with n-gram speculation (tok/s)", "f32",
           "llama_f32_ngram", "tokens_per_s", ">=", 0.9),
    Target("cpu_burst", "burst: ours f32 with speculation >= 0.97 x without (tok/s)", "f32", "f32_nospec",
           "tokens_per_s", ">=", 0.97),
    # issue 29: real size, speculation off on both sides
    *(Target("real_alone", f"real size, alone: ours {a} >= 1.0 x llama-server {b} (tok/s)", f"real_{a}",
             f"real_llama_{b}", "tokens_per_s", ">=", 1.0)
      for a, b in (("int4", "q4_0"), ("int8", "q8_0"), ("f32", "f32"), ("bf16", "f16"))),
    Target("real_burst", "real size, burst: ours int4 >= 1.2 x llama-server q4_0 (tok/s)", "real_int4",
           "real_llama_q4_0", "tokens_per_s", ">=", 1.2),
    Target("real_alone", "real size, alone, the same q4_0 file: ours >= 1.0 x llama-server (tok/s)", "real_gguf_q4_0",
           "real_llama_q4_0", "tokens_per_s", ">=", 1.0),
    Target("real_burst", "real size: resident memory ours int4 <= 1.25 x llama-server q4_0", "real_int4",
           "real_llama_q4_0", "rss_mb", "<=", 1.25),
    Target("real_burst", "real size: peak memory (loading included) ours int4 <= 1.3 x its resident", "real_int4",
           "real_int4", "peak_rss_mb", "<=", 1.3, "rss_mb"),
    # issue 19
    Target("structured_corpus", "structured: every finished answer valid against its schema (valid / finished)",
           "corpus", "corpus", "valid", ">=", 1.0, "finished"),
    Target("structured_burst", "structured: constrained, no fast-forward >= 0.9 x unconstrained (tok/s)", "no_ff",
           "unconstrained", "tokens_per_s", ">=", 0.9),
    Target("structured_burst", "structured: constrained + fast-forward >= 1.0 x unconstrained (tok/s)", "ff",
           "unconstrained", "tokens_per_s", ">=", 1.0),
    Target("structured_sampled", "structured, sampled: constrained + fast-forward >= 0.9 x unconstrained (tok/s, "
           "issue 31)", "ff", "unconstrained", "tokens_per_s", ">=", 0.9),
    Target("structured_alone", "structured: TTFT p50 of a new schema <= 1.2 x unconstrained", "new_schema",
           "unconstrained", "ttft_p50_ms", "<=", 1.2),
    # issue 21
    Target("users", "users: B's TTFT p50 with fair share <= 0.25 x FIFO's", "fair", "fifo", "ttft_p50_ms", "<=", 0.25),
    Target("users", "users: B's TTFT p50 with fair share <= 3 x on an idle server", "fair", "idle", "ttft_p50_ms",
           "<=", 3.0),
    Target("users", "users: A's burst with fair share >= 0.95 x FIFO's (tok/s)", "fair", "fifo", "a_tokens_per_s",
           ">=", 0.95),
)


def _median(results: dict[str, Any], workload: str, contender: str, metric: str) -> float | None:
    try:
        return results["workloads"][workload]["contenders"][contender]["median"][metric]
    except (KeyError, TypeError):
        return None


def ratio(results: dict[str, Any], workload: str, a: str, b: str, metric: str = "tokens_per_s",
          other_metric: str | None = None) -> float | None:
    x, y = _median(results, workload, a, metric), _median(results, workload, b, other_metric or metric)
    return x / y if x is not None and y else None


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        value = ratio(results, t.workload, t.ours, t.other, t.metric, t.other_metric)
        met = None if value is None else (value >= t.bound if t.op == ">=" else value <= t.bound)
        out.append({"workload": t.workload, "target": t.text, "ratio": value, "op": t.op, "bound": t.bound, "met": met})
    return out


def _in_order(keys: Iterable[str]) -> list[str]:
    """Contender keys in table order (``ORDER``), unknown ones last."""
    return sorted(keys, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))


def _label(contenders: dict[str, Any], workload: str, key: str) -> str:
    """A contender's label; in the HTTP table the in-process baseline says so."""
    return contenders[key]["label"] + (" (in-process)" if workload == "http" and key == "continuous" else "")


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_tables(results: dict[str, Any]) -> str:
    lines: list[str] = []
    head = f"{'contender':<36}{'tok/s':>9}{'x seq':>7}{'TTFT p50':>10}{'TTFT p99':>10}{'lat p50':>10}{'lat p99':>10}"
    for name, entry in results["workloads"].items():
        lines += ["", f"{TITLES.get(name, name)}: {entry.get('description', '')}"]
        if "error" in entry:
            lines.append(f"  not measured: {entry['error']}")
            continue
        lines += [head + "   (ms)", "-" * (len(head) + 7)]
        contenders = entry["contenders"]
        base = contenders.get("sequential", {}).get("median", {}).get("tokens_per_s")
        for key in _in_order(contenders):
            m = contenders[key]["median"]
            label = _label(contenders, name, key)
            tps = m.get("tokens_per_s")
            lines.append(
                f"{label:<36}{_fmt(tps):>9}{_fmt(tps / base if tps and base else None, '.2f'):>7}"
                f"{_fmt(m.get('ttft_p50_ms')):>10}{_fmt(m.get('ttft_p99_ms')):>10}"
                f"{_fmt(m.get('latency_p50_ms')):>10}{_fmt(m.get('latency_p99_ms')):>10}"
            )
        noise = [contenders[k]["median"].get("other_cpu_share") for k in contenders]
        noise = [n for n in noise if n is not None]
        if noise and max(noise) > 0.05:
            lines.append(f"  (noise: other processes used up to {max(noise):.0%} of the CPUs during these runs "
                         "(median per contender); ratios are comparable only so far as that was even)")
        columns = EXTRA_COLUMNS.get(name)
        if columns:
            lines.append(f"{'':<36}" + "".join(f"{title:>12}" for title, _, _ in columns)
                         + ("   (ms)" if name in ("interference", "structured_alone") else ""))
            for key in _in_order(contenders):
                m = contenders[key]["median"]
                lines.append(f"{_label(contenders, name, key):<36}"
                             + "".join(f"{_fmt(m.get(metric), spec):>12}" for _, metric, spec in columns))
        for note in entry.get("notes", []):
            lines.append(f"  note: {note}")
        ceiling = contenders.get("ceiling", {}).get("median", {})
        if ceiling.get("bare_loop_tokens_per_s"):
            lines.append(f"  (ceiling = bare decode steps only, {ceiling['decode_step_ms']:.1f} ms/step; the same "
                         f"bare loop with its prefill: {ceiling['bare_loop_tokens_per_s']:.1f} tok/s)")
        ours = {"http": "http", "real_alone": "real_int4", "real_burst": "real_int4", "cpu_burst": "f32", "cpu_alone": "f32", "cpu_copy": "f32", "structured_burst": "ff",
                "structured_sampled": "ff", "structured_alone": "new_schema"}.get(name, "continuous")
        others = [k for k in contenders if k != ours]
        metric, what = {"open": ("ttft_p50_ms", "TTFT p50"), "agents": ("ttft_p50_ms", "TTFT p50"),
                        "interference": ("worst_gap_ms", "worst gap"),
                        "structured_alone": ("ttft_p50_ms", "TTFT p50")}.get(name, ("tokens_per_s", "throughput"))
        parts = [f"{contenders[k]['label']} {_fmt(ratio(results, name, ours, k, metric), '.2f')}x" for k in others]
        if parts and ours in contenders:
            lines.append(f"  {contenders[ours]['label']} {what} vs: " + ", ".join(parts))
    return "\n".join(lines)


def format_targets(results: dict[str, Any]) -> str:
    lines = ["", "Targets (issues 4, 12, 14, 18, 19, 20, 21, 29 and 31; ratios within this run):"]
    absent = 0  # targets against a contender this run did not have (the other servers: benchmarks/)
    for t, target in zip(evaluate_targets(results), TARGETS, strict=True):
        contenders = results["workloads"].get(t["workload"], {}).get("contenders", {})
        if t["ratio"] is None and not {target.ours, target.other} <= set(contenders):
            absent += 1
            continue
        if t["ratio"] is None:
            lines.append(f"  [ n/a ] {t['target']}: not measured")
            continue
        state = "met" if t["met"] else "MISSED"
        lines.append(f"  [{state:^6}] {t['target']}: {t['ratio']:.2f} (target {t['op']} {t['bound']:g})")
    if absent:
        lines.append(f"  ({absent} more against contenders this run did not measure: other servers and "
                     "libraries are the repository's `python -m benchmarks`)")
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps({**results, "targets": evaluate_targets(results)}, indent=2) + "\n")


def write_chart(results: dict[str, Any], path: Path) -> None:
    """One panel per workload: throughput (burst, mixed, HTTP), TTFT p50/p99 (open loop,
    agents, a new schema), worst stall and long-prompt TTFT (interference), KV memory
    (lengths), constrained throughput (structured); one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = results["workloads"]
    Rows = list[tuple[str, float | None, float | None]]

    def bars(name: str, first: str, second: str | None) -> Rows:
        cs = workloads[name]["contenders"]
        return [(_label(cs, name, k), cs[k]["median"].get(first), cs[k]["median"].get(second) if second else None)
                for k in _in_order(cs)]

    kinds = {"burst": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "mixed": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "open": ("TTFT p50 / p99", "ms", "ttft_p50_ms", "ttft_p99_ms", ("p50", "p99")),
             "agents": ("TTFT p50 / p99", "ms", "ttft_p50_ms", "ttft_p99_ms", ("p50", "p99")),
             "interference": ("streams' worst gap / long prompt's TTFT", "ms", "worst_gap_ms", "long_ttft_ms",
                              ("worst gap", "long TTFT")),
             "lengths": ("KV memory held / needed, most tokens", "MB", "kv_peak_mb", "kv_peak_needed_mb",
                         ("held", "needed")),
             "http": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "cpu_burst": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "cpu_alone": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "cpu_copy": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "structured_burst": ("generated tokens/s", "tokens/s", "tokens_per_s", None, None),
             "structured_sampled": ("generated tokens/s, sampled", "tokens/s", "tokens_per_s", None, None),
             "structured_alone": ("TTFT p50 / p99", "ms", "ttft_p50_ms", "ttft_p99_ms", ("p50", "p99"))}
    panels = [(name, *kinds[name]) for name in kinds if "contenders" in workloads.get(name, {})]
    cols = min(3, max(len(panels), 1))
    rows_n = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.4 * cols, 4.8 * rows_n), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (name, title, unit, first, second, legend) in zip(axes.flat, panels, strict=False):
        rows = bars(name, first, second)
        labels = [r[0].replace(" (", "\n(").replace(": ", ":\n") for r in rows]
        xs = list(range(len(rows)))
        if legend and legend[0] == "p50":  # p99 stacked on p50
            ax.bar(xs, [r[1] or 0 for r in rows], color="#4c72b0", label="p50")
            ax.bar(xs, [max((r[2] or 0) - (r[1] or 0), 0) for r in rows], bottom=[r[1] or 0 for r in rows],
                   color="#dd8452", label="p99")
            ax.legend()
        elif legend:  # two metrics side by side
            ax.bar([x - 0.2 for x in xs], [r[1] or 0 for r in rows], width=0.4, color="#4c72b0", label=legend[0])
            ax.bar([x + 0.2 for x in xs], [r[2] or 0 for r in rows], width=0.4, color="#dd8452", label=legend[1])
            ax.legend()
        else:
            ax.bar(xs, [r[1] or 0 for r in rows], color="#4c72b0")
        for x, r in zip(xs, rows, strict=True):
            if r[1]:
                ax.annotate(f"{r[1]:.0f}", (x - (0.2 if legend and legend[0] != "p50" else 0), r[1]),
                            ha="center", va="bottom", fontsize=8)
        ax.set_xticks(xs, labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(f"{TITLES.get(name, name)}: {title}", fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    meta = results.get("meta", {})
    fig.suptitle(f"jupyter infer bench: {meta.get('architecture')} {(meta.get('parameters') or 0) / 1e6:.0f}M, "
                 f"{meta.get('dtype')} on {meta.get('device')} x{meta.get('torch_threads')} threads, "
                 f"median of {meta.get('repeats')}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
