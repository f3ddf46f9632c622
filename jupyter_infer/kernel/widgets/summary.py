"""The numbers under a timeline: TTFT and latency p50/p95, tokens/s, batch sizes, and how many
requests were constrained (structured outputs) with the share of tokens fast-forwarded.

Mid-run, each figure is computed from what is known so far and says how many requests it
covers: a row still waiting for its first token has no TTFT yet (how long it has waited is
not one), a row still running has no latency.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...values.metrics import percentile


@dataclass
class RunSummary:
    """A run of requests at a glance (times in ms)."""

    requests: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0  # not ended yet (queued or generating)
    ttft_known: int = 0  # requests whose first token is known: what the TTFT figures cover
    latency_known: int = 0  # requests that finished ok: what the latency figures cover
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    tokens: int = 0
    wall_s: float | None = None
    tokens_per_s: float | None = None
    batches: int = 0
    mean_batch_size: float | None = None  # over engine steps, as the server's metric
    batch_size_histogram: dict[int, int] = field(default_factory=dict)  # size -> steps
    constrained: int = 0  # requests held to a constraint (JSON schema, regex, choice, grammar, tools)
    constraint_kinds: dict[str, int] = field(default_factory=dict)  # kind -> requests
    forced_tokens: int = 0  # tokens grammars forced (fast-forwarded, not sampled)
    forced_share: float | None = None  # forced_tokens over all tokens

    @classmethod
    def from_timeline(
        cls, rows: Sequence[Mapping[str, Any]], batches: Sequence[Mapping[str, Any]], now: float | None = None,
    ) -> RunSummary:
        """From ``timeline_data`` rows and batches (or a ``BatchTimeline``'s traits). Mid-run,
        ``now`` (epoch s) ends the wall time: the tokens counted so far over the time so far."""
        outcomes = Counter(r.get("outcome") for r in rows)
        running = sum(1 for r in rows if not r.get("finished_at") and r.get("outcome") in (None, "queued", "running"))
        ttft = [(r["first_token_at"] - r["queued_at"]) * 1000 for r in rows
                if r.get("first_token_at") and r.get("queued_at")]
        latency = [(r["finished_at"] - r["queued_at"]) * 1000 for r in rows
                   if r.get("finished_at") and r.get("queued_at") and r.get("outcome") == "ok"]
        tokens = sum(int(r.get("tokens") or 0) for r in rows)
        starts = [r["queued_at"] for r in rows if r.get("queued_at")]
        ends = [r["finished_at"] for r in rows if r.get("finished_at")]
        if running and now is not None:
            ends.append(now)
        wall = (max(ends) - min(starts)) if starts and ends else None
        histogram: Counter[int] = Counter()
        for b in batches:
            histogram[int(b.get("size") or len(b.get("members", [])))] += max(int(b.get("steps") or 0), 1)
        steps = sum(histogram.values())
        kinds = Counter(str(r["constraint"]) for r in rows if r.get("constraint"))
        forced = sum(int(r.get("forced_tokens") or 0) for r in rows)
        return cls(
            requests=len(rows),
            ok=outcomes["ok"],
            failed=outcomes["failed"] + outcomes["error"],
            cancelled=outcomes["cancelled"],
            running=running,
            ttft_known=len(ttft),
            latency_known=len(latency),
            ttft_p50_ms=_round(percentile(ttft, 50)),
            ttft_p95_ms=_round(percentile(ttft, 95)),
            latency_p50_ms=_round(percentile(latency, 50)),
            latency_p95_ms=_round(percentile(latency, 95)),
            tokens=tokens,
            wall_s=_round(wall, 3),
            tokens_per_s=_round(tokens / wall) if wall else None,
            batches=len(batches),
            mean_batch_size=_round(sum(k * v for k, v in histogram.items()) / steps, 2) if steps else None,
            batch_size_histogram=dict(sorted(histogram.items())),
            constrained=sum(kinds.values()),
            constraint_kinds=dict(kinds.most_common()),
            forced_tokens=forced,
            forced_share=_round(forced / tokens, 3) if tokens else None,
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["batch_size_histogram"] = {str(k): v for k, v in self.batch_size_histogram.items()}
        return out

    def __str__(self) -> str:
        hist = ", ".join(f"{k}: {v}" for k, v in self.batch_size_histogram.items()) or "-"
        running = f", {self.running} running" if self.running else ""
        return (
            f"{self.requests} requests ({self.ok} ok, {self.failed} failed, {self.cancelled} cancelled{running}) · "
            f"TTFT p50 {_ms(self.ttft_p50_ms)} p95 {_ms(self.ttft_p95_ms)}{self._covers(self.ttft_known)} · "
            f"latency p50 {_ms(self.latency_p50_ms)} p95 {_ms(self.latency_p95_ms)}{self._covers(self.latency_known)} · "
            f"{self.tokens} tokens, {_num(self.tokens_per_s)} tokens/s · "
            f"{self.batches} batches, mean size {_num(self.mean_batch_size)} · "
            f"steps by batch size {{{hist}}}"
            + (f" · {self.constrained} constrained ({self._kinds()}), {self._forced()}" if self.constrained else "")
        )

    def _kinds(self) -> str:
        return ", ".join(f"{n} {KIND_NAMES.get(k, k)}" for k, n in self.constraint_kinds.items())

    def _forced(self) -> str:
        """Like "8 of 42 tokens fast-forwarded (19%)"."""
        share = f" ({self.forced_share:.0%})" if self.forced_share is not None else ""
        return f"{self.forced_tokens} of {self.tokens} tokens fast-forwarded{share}"

    def _covers(self, known: int) -> str:
        """Say how many requests a figure covers ("5 of 8") when that is not all of them."""
        return f" ({known} of {self.requests})" if known < self.requests else ""

    def to_html(self) -> str:
        cells = [
            ("requests", f"{self.requests} <small>({self.ok} ok"
             + (f", {self.failed} failed" if self.failed else "")
             + (f", {self.cancelled} cancelled" if self.cancelled else "")
             + (f", {self.running} running" if self.running else "") + ")</small>"),
            ("TTFT p50 / p95", f"{_ms(self.ttft_p50_ms)} / {_ms(self.ttft_p95_ms)}"
             f"<small>{self._covers(self.ttft_known)}</small>"),
            ("latency p50 / p95", f"{_ms(self.latency_p50_ms)} / {_ms(self.latency_p95_ms)}"
             f"<small>{self._covers(self.latency_known)}</small>"),
            ("tokens/s", f"{_num(self.tokens_per_s)} <small>({self.tokens} tokens in {_num(self.wall_s)} s)</small>"),
            ("mean batch size", f"{_num(self.mean_batch_size)} <small>({self.batches} batches)</small>"),
        ]
        if self.constrained:  # structured outputs in this run: how many, and what the grammar forced
            cells.append(("constrained", f"{self.constrained} <small>({html.escape(self._kinds())})</small>"))
            cells.append(("fast-forwarded", f"{_share(self.forced_share)} "
                          f"<small>({self.forced_tokens} of {self.tokens} tokens)</small>"))
        stats = "".join(
            f'<div style="min-width:110px"><div style="color:var(--jp-ui-font-color2,#777)">{html.escape(name)}</div>'
            f'<div style="font-size:15px;font-weight:600">{value}</div></div>'
            for name, value in cells
        )
        return (
            '<div class="ji-summary" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;'
            'display:flex;flex-wrap:wrap;gap:18px;align-items:flex-end">'
            + stats + self._histogram_html() + "</div>"
        )

    def _histogram_html(self) -> str:
        if not self.batch_size_histogram:
            return ""
        top = max(self.batch_size_histogram.values())
        bars = "".join(
            f'<div title="batch size {size}: {count} steps" style="display:flex;flex-direction:column;'
            f'align-items:center;justify-content:flex-end;height:56px">'
            f'<div style="width:14px;height:{max(2, round(40 * count / top))}px;background:#4c78a8"></div>'
            f'<div style="font-size:10px;color:var(--jp-ui-font-color2,#777)">{size}</div></div>'
            for size, count in self.batch_size_histogram.items()
        )
        return (
            '<div><div style="color:var(--jp-ui-font-color2,#777)">steps by batch size</div>'
            f'<div style="display:flex;gap:3px;align-items:flex-end">{bars}</div></div>'
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return self.to_html()


# How a constraint's kind reads (as the timeline's tooltips name it).
KIND_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
              "grammar": "grammar", "tools": "tool calls"}


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"
