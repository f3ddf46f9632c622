"""The soak's figures: what each round left behind in the server, and the summary over rounds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..values.metrics import percentile


@dataclass
class Round:
    """One soak round: requests sent and lost by kind, ``api/status`` latencies, and the
    server's RSS, open file descriptors and threads once it was idle again."""

    sent: Counter = field(default_factory=Counter)
    lost: Counter = field(default_factory=Counter)
    status_ms: list[float] = field(default_factory=list)
    rss_mb: float | None = None
    fds: int | None = None
    threads: int | None = None
    wall_s: float = 0.0


def report(rounds: list[Round]) -> dict[str, Any]:
    """Each round's row, and what the last round left behind against the first after the warm-up."""
    first = 1 if len(rounds) > 2 else 0  # round 0 warms caches and allocator arenas
    base = rounds[first]
    rows = []
    for i, r in enumerate(rounds):
        rows.append({
            "round": i, "sent": sum(r.sent.values()), "lost": sum(r.lost.values()), "wall_s": round(r.wall_s, 1),
            "rss_mb": None if r.rss_mb is None else round(r.rss_mb, 1), "fds": r.fds, "threads": r.threads,
            "status_p99_ms": round(percentile(r.status_ms, 99) or 0, 1),
            "status_max_ms": round(max(r.status_ms, default=0), 1),
        })
    last = rounds[-1]
    all_status = [ms for r in rounds for ms in r.status_ms]
    return {
        "rounds": rows,
        "growth_since_round": first,
        "sent": dict(sum((r.sent for r in rounds), Counter())),
        "lost": dict(sum((r.lost for r in rounds), Counter())),
        "rss_growth_mb": None if last.rss_mb is None or base.rss_mb is None else round(last.rss_mb - base.rss_mb, 1),
        "fds_growth": None if last.fds is None or base.fds is None else last.fds - base.fds,
        "threads_growth": None if last.threads is None or base.threads is None else last.threads - base.threads,
        "status_p99_ms": round(percentile(all_status, 99) or 0, 1),
        "status_max_ms": round(max(all_status, default=0), 1),
    }


def format_report(summary: dict[str, Any]) -> str:
    """``report``'s summary as the table the soak prints."""
    lines = [f"{'round':>5} {'sent':>6} {'lost':>5} {'wall s':>7} {'RSS MB':>8} {'fds':>5} {'threads':>7} "
             f"{'status p99 ms':>14} {'max ms':>7}"]
    for r in summary["rounds"]:
        lines.append(f"{r['round']:>5} {r['sent']:>6} {r['lost']:>5} {r['wall_s']:>7} {r['rss_mb'] or '-':>8} "
                     f"{r['fds'] or '-':>5} {r['threads'] or '-':>7} {r['status_p99_ms']:>14} {r['status_max_ms']:>7}")
    lines += [
        "",
        f"sent:  {summary['sent']}",
        f"lost:  {summary['lost'] or 0}",
        f"last round against round {summary['growth_since_round']}: RSS {summary['rss_growth_mb']:+} MB, "
        f"fds {summary['fds_growth']:+}, threads {summary['threads_growth']:+}"
        if summary["rss_growth_mb"] is not None else "process figures: n/a",
        f"Jupyter api/status during the run: p99 {summary['status_p99_ms']} ms, max {summary['status_max_ms']} ms",
    ]
    return "\n".join(lines)
