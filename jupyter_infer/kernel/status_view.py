"""What ``%infer_status`` and ``%infer_model`` show: the service's status and its models as a
table (plain text and HTML), and the phrases for its weights, CPU threads and loading."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ..values.sizes import readable_bytes, weights_format

if TYPE_CHECKING:
    from .client import Client


def status_bundle(client: Client, status: dict[str, Any], metrics: dict[str, Any]) -> dict[str, str]:
    requests = metrics.get("requests", {})
    ttft = metrics.get("ttft_ms") or {}
    latency = metrics.get("latency_ms") or {}
    rows = [
        ("connection", str(client.connection)),
        ("state", status.get("state")),
        *served_rows(status),
        ("weights", describe_weights(status)),
        ("loading", describe_loading(status)),
        ("CPU threads", describe_cpu(status)),
        ("scheduling mode", status.get("mode")),
        ("fallback reason", status.get("fallback_reason") or "–"),
        ("queue / running", f"{status.get('queue_depth', metrics.get('queue_depth'))} / {status.get('running', requests.get('running'))}"),
        ("requests", ", ".join(f"{k} {requests.get(k, 0)}" for k in ("ok", "failed", "cancelled", "rejected"))),
        ("TTFT p50 / p95", f"{ms(ttft.get('p50'))} / {ms(ttft.get('p95'))}"),
        ("latency p50 / p95", f"{ms(latency.get('p50'))} / {ms(latency.get('p95'))}"),
        ("tokens/s", str(metrics.get("tokens_per_s") or "–")),
        ("mean batch size", str(metrics.get("mean_batch_size") or "–")),
    ]
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    table = "".join(
        f"<tr><th style='text-align:left;padding-right:12px'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return {"text/plain": text, "text/html": f"<table>{table}</table>"}


def served_rows(status: dict[str, Any]) -> list[tuple[str, str]]:
    """Engine, model and device; before a load ends (or after one failed), what was asked for
    instead of ``None``s."""
    if status.get("engine") is not None:
        return [("engine", str(status["engine"])), ("model", str(status.get("model"))),
                ("device", f"{status.get('device')} ({status.get('dtype')})")]
    asked = status.get("configured") or {}
    state = status.get("state") or "not ready"
    return [("engine", f"{asked.get('engine', 'auto')} ({state})"),
            ("model", f"{asked.get('model', '–')} ({state})"), ("device", f"{asked.get('device', 'auto')} ({state})")]


def models_bundle(answer: dict[str, Any]) -> dict[str, str]:
    """``infer/models`` as a table: the loaded one marked, each model's id, source and size."""
    rows = [("●" if m.get("loaded") else "", str(m.get("id")), str(m.get("source")),
             readable_bytes(m["size_bytes"]) if m.get("size_bytes") else "–") for m in answer.get("models", [])]
    head = f"state: {answer.get('state')} · loaded: {answer.get('model') or '–'}"
    width = max([len(r[1]) for r in rows] + [5])
    text = "\n".join([head] + [f"{mark:1} {name:<{width}}  {source:<11} {size}" for mark, name, source, size in rows])
    cells = "".join(f"<tr><td>{mark}</td><td>{html.escape(name)}</td><td>{html.escape(source)}</td><td>{size}</td></tr>"
                    for mark, name, source, size in rows)
    return {"text/plain": text, "text/html": f"<p>{html.escape(head)}</p><table>{cells}</table>"}


def describe_weights(status: dict[str, Any]) -> str:
    """How the model is held: its format, and its bytes and the process's, once loaded."""
    details = status.get("details") or {}
    held = weights_format(details, status.get("dtype"))
    if not held:
        return "–"
    sizes = [f"{readable_bytes(details[key])} {what}" for key, what in (("weight_bytes", "of weights"),
                                                               ("rss_after_load_bytes", "resident"))
             if details.get(key)]
    return f"{held}" + (f" ({', '.join(sizes)})" if sizes else "")


def describe_cpu(status: dict[str, Any]) -> str:
    """The engine's threads, and why fewer than it may use (another process on the CPUs)."""
    cpu = status.get("cpu")
    if not cpu:
        return "–"
    return cpu.get("note") or f"{cpu['threads']} of {cpu['threads_max']}"


def describe_loading(status: dict[str, Any]) -> str:
    """Where loading is (while it goes), or what it took (once done)."""
    loading = status.get("loading")
    if not loading:
        return "–"
    if status.get("state") != "loading":
        return f"took {loading['elapsed_s']} s" if loading.get("phase") == "done" else f"stopped at: {loading['phase']}"
    count = f": {loading['done']} of {loading['total']} {loading['unit']}" if loading.get("total") else ""
    left = f", about {loading['phase_left_s']:.0f} s left" if loading.get("phase_left_s") is not None else ""
    return f"{loading['phase']}{count} ({loading['elapsed_s']} s so far{left})"


def ms(value: float | None) -> str:
    """Milliseconds as a person reads them, ``–`` for none."""
    return "–" if value is None else f"{value:.0f} ms"
