"""[p] the machine's multiply-add peak and our prompt path's linears against it (issue 49).

The peak is measured, not quoted (``cpu/mac_peak.py``: independent chains of the widest dot
instruction our kernel build has, on the bench's threads): int8 (VNNI, or AVX2's two-step
product), bfloat16 (AVX512-BF16, else float32 FMAs), float32. Our linears run the four shapes
of a Qwen2.5-0.5B decoder layer at prompt-sized row counts; the share is of the peak of the
instructions each kind runs on (int4 and int8: the int8 peak)."""

from __future__ import annotations

from typing import Any

ROWS = (64, 256, 1024, 2048)
QUICK_ROWS = (64, 256)
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
    return {"machine": machine, "linears": linears}


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
    return "\n".join(lines)
