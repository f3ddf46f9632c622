"""The benchmark's output: a table per workload, ratios, the issue's targets, JSON and a chart."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORDER = ("sequential", "static", "window", "continuous", "hf_cb", "ceiling", "http")
TITLES = {"burst": "[a] burst", "mixed": "[b] mixed", "open": "[c] open loop", "http": "[d] over HTTP+SSE"}


@dataclass(frozen=True)
class Target:
    """One of issue 4's targets: ``ours`` vs ``other`` on ``metric`` in one workload."""

    workload: str
    text: str
    ours: str
    other: str
    metric: str
    op: str  # ">=": a ratio to reach; "<=": a ratio to stay under
    bound: float


TARGETS = (
    Target("burst", "continuous >= 0.90 x the decode-step ceiling (tok/s)", "continuous", "ceiling", "tokens_per_s", ">=", 0.90),
    Target("burst", "continuous >= 5 x sequential generate (tok/s)", "continuous", "sequential", "tokens_per_s", ">=", 5.0),
    Target("mixed", "continuous >= 1.3 x one padded batch (tok/s)", "continuous", "static", "tokens_per_s", ">=", 1.3),
    Target("mixed", "continuous >= 1.2 x transformers' continuous batching (tok/s)", "continuous", "hf_cb", "tokens_per_s", ">=", 1.2),
    Target("open", "TTFT p50: continuous <= 0.25 x window", "continuous", "window", "ttft_p50_ms", "<=", 0.25),
    Target("http", "over HTTP+SSE >= 0.9 x in-process (tok/s)", "http", "continuous", "tokens_per_s", ">=", 0.9),
)


def _median(results: dict[str, Any], workload: str, contender: str, metric: str) -> float | None:
    try:
        return results["workloads"][workload]["contenders"][contender]["median"][metric]
    except (KeyError, TypeError):
        return None


def ratio(results: dict[str, Any], workload: str, a: str, b: str, metric: str = "tokens_per_s") -> float | None:
    x, y = _median(results, workload, a, metric), _median(results, workload, b, metric)
    return x / y if x is not None and y else None


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        value = ratio(results, t.workload, t.ours, t.other, t.metric)
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
        noise = [contenders[k]["median"].get("other_cpu_share") for k in contenders if k != "http"]
        noise = [n for n in noise if n is not None]
        if noise and max(noise) > 0.05:
            lines.append(f"  (noise: other processes used up to {max(noise):.0%} of the CPUs during these runs "
                         "(median per contender); ratios are comparable only so far as that was even)")
        ceiling = contenders.get("ceiling", {}).get("median", {})
        if ceiling.get("bare_loop_tokens_per_s"):
            lines.append(f"  (ceiling = bare decode steps only, {ceiling['decode_step_ms']:.1f} ms/step; the same "
                         f"bare loop with its prefill: {ceiling['bare_loop_tokens_per_s']:.1f} tok/s)")
        ours = "http" if name == "http" else "continuous"
        others = [k for k in contenders if k != ours]
        metric = "ttft_p50_ms" if name == "open" else "tokens_per_s"
        parts = [f"{contenders[k]['label']} {_fmt(ratio(results, name, ours, k, metric), '.2f')}x" for k in others]
        if parts:
            what = "TTFT p50" if name == "open" else "throughput"
            lines.append(f"  {contenders[ours]['label']} {what} vs: " + ", ".join(parts))
    return "\n".join(lines)


def format_targets(results: dict[str, Any]) -> str:
    lines = ["", "Targets (issue 4; ratios within this run):"]
    for t in evaluate_targets(results):
        if t["ratio"] is None:
            lines.append(f"  [ n/a ] {t['target']}: not measured")
            continue
        state = "met" if t["met"] else "MISSED"
        lines.append(f"  [{state:^6}] {t['target']}: {t['ratio']:.2f} (target {t['op']} {t['bound']:g})")
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps({**results, "targets": evaluate_targets(results)}, indent=2) + "\n")


def write_chart(results: dict[str, Any], path: Path) -> None:
    """Throughput per contender (burst, mixed, HTTP) and open-loop TTFT, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, str, Callable[[dict], list[tuple[str, float | None, float | None]]]]] = []
    workloads = results["workloads"]

    def throughput(name: str) -> list[tuple[str, float | None, float | None]]:
        cs = workloads[name]["contenders"]
        return [(_label(cs, name, k), cs[k]["median"].get("tokens_per_s"), None) for k in _in_order(cs)]

    def ttft(name: str) -> list[tuple[str, float | None, float | None]]:
        cs = workloads[name]["contenders"]
        return [(cs[k]["label"], cs[k]["median"].get("ttft_p50_ms"), cs[k]["median"].get("ttft_p99_ms")) for k in cs]

    for name in ("burst", "mixed", "open", "http"):
        if "contenders" not in workloads.get(name, {}):
            continue
        if name == "open":
            panels.append((f"{TITLES[name]}: TTFT p50 / p99", "ms", lambda: ttft("open")))
        else:
            panels.append((f"{TITLES[name]}: generated tokens/s", "tokens/s", lambda n=name: throughput(n)))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.2 * max(len(panels), 1), 4.8), squeeze=False)
    for ax, (title, unit, rows_of) in zip(axes[0], panels, strict=False):
        rows = rows_of()
        labels = [r[0].replace(" (", "\n(").replace(": ", ":\n") for r in rows]
        xs = range(len(rows))
        ax.bar(xs, [r[1] or 0 for r in rows], color="#4c72b0", label="p50" if rows and rows[0][2] is not None else None)
        if rows and any(r[2] is not None for r in rows):
            ax.bar(xs, [(r[2] or 0) - (r[1] or 0) for r in rows], bottom=[r[1] or 0 for r in rows],
                   color="#dd8452", label="p99")
            ax.legend()
        for x, r in zip(xs, rows, strict=True):
            if r[1]:
                ax.annotate(f"{r[1]:.0f}", (x, r[1]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    meta = results.get("meta", {})
    fig.suptitle(f"jupyter infer bench: {meta.get('architecture')} {(meta.get('parameters') or 0) / 1e6:.0f}M, "
                 f"{meta.get('dtype')} on {meta.get('device')} x{meta.get('torch_threads')} threads, "
                 f"median of {meta.get('repeats')}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
