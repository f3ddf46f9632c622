"""[p] the machine's multiply-add peak and our prompt path's linears against it (issue 49).

The peak is measured, not quoted (``cpu/mac_peak.py``: independent chains of the widest dot
instruction our kernel build has, on the bench's threads): int8 (VNNI, or AVX2's two-step
product), bfloat16 (AVX512-BF16, else float32 FMAs), float32. Our linears run the four shapes
of a Qwen2.5-0.5B decoder layer at prompt-sized row counts; the share is of the peak of the
instructions each kind runs on (int4 and int8: the int8 peak). A fresh prompt's attention in
that model's shape too: ours (the bfloat16 dot where the build has it, else float32 FMAs, the
AVX2 kernel), our float32 kernel, and torch's SDPA, against the bfloat16 and float32 peaks."""

from __future__ import annotations

from typing import Any

ROWS = (64, 256, 1024, 2048)
QUICK_ROWS = (64, 256)
ATTENTION_TOKENS = (1024, 3072)
QUICK_ATTENTION_TOKENS = (256,)
# The peak each attention path runs against ("ours": the bfloat16 peak, which is float32's
# where the build has no bfloat16 dot, as is its kernel then).
ATTENTION_PEAK_OF = {"ours": "bfloat16", "ours_f32": "float32", "sdpa": "float32"}
PEAK_OF = {"int4": "int8", "int8": "int8", "bfloat16": "bfloat16", "float32": "float32"}


def measure(quick: bool, log: Any) -> dict[str, Any]:
    """The peaks and our linears' rates (GMAC/s), or why not."""
    from ...cpu import kernels, mac_peak

    if why := kernels.unavailable():
        return {"error": why}
    machine = {kind: round(mac_peak.peak_gmacs(kind), 1) for kind in mac_peak.KINDS}
    log(f"  peak GMAC/s: {machine}")
    linears: dict[str, dict[int, float]] = {}
    for kind in PEAK_OF:
        linears[kind] = {rows: round(mac_peak.linear_gmacs(kind, rows), 1) for rows in (QUICK_ROWS if quick else ROWS)}
        log(f"  {kind}: {linears[kind]}")
    attention: dict[str, dict[int, float]] = {}
    for path in mac_peak.ATTENTION_PATHS:
        attention[path] = {n: round(mac_peak.attention_gmacs(path, n), 1)
                           for n in (QUICK_ATTENTION_TOKENS if quick else ATTENTION_TOKENS)}
        log(f"  attention {path}: {attention[path]}")
    return {"machine": machine, "linears": linears, "attention": attention}


def table(entry: dict[str, Any]) -> str:
    """The section's table: each kind's GMAC/s per row count, and its share of the peak."""
    lines = ["", "[p] peak: our linears (a 0.5b-shaped layer) against the machine's measured multiply-add peak"]
    if "error" in entry:
        return "\n".join([*lines, f"  not measured: {entry['error']}"])
    machine = entry["machine"]
    lines.append("  peak GMAC/s: " + ", ".join(f"{k} {v:.0f}" for k, v in machine.items()))
    rows = sorted({r for kind in entry["linears"].values() for r in kind}, key=int)
    lines.append(f"  {'linears':<10}" + "".join(f"{f'{r} rows':>18}" for r in rows))
    for kind, rates in entry["linears"].items():
        top = machine[PEAK_OF[kind]]
        cells = [f"{rates[r]:.0f} ({rates[r] / top:.0%})" if r in rates else "–" for r in rows]
        lines.append(f"  {kind:<10}" + "".join(f"{c:>18}" for c in cells))
    attention = entry.get("attention") or {}
    counts = sorted({n for rates in attention.values() for n in rates}, key=int)
    if counts:
        lines.append(f"  {'attention':<10}" + "".join(f"{f'{n} tokens':>18}" for n in counts))
    for path, rates in attention.items():
        top = machine[ATTENTION_PEAK_OF[path]]
        cells = [f"{rates[n]:.0f} ({rates[n] / top:.0%})" if n in rates else "–" for n in counts]
        lines.append(f"  {path:<10}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)
