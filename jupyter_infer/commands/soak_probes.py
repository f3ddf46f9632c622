"""Probes of a live server for the soak (issue 9's closing note): the process's own figures,
``api/status`` latency while refused megabyte prompts arrive, and a burst's slowdown with
hundreds of idle event subscribers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

from ..values.metrics import percentile
from ..values.prompts import SAMPLE_PROMPTS


def process_figures(pid: int | None) -> tuple[float | None, int | None, int | None]:
    """RSS (MB), open file descriptors and threads of ``pid``, from Linux's ``/proc``."""
    if pid is None or not os.path.exists(f"/proc/{pid}/status"):
        return None, None, None
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
    rss_kb = int(fields["VmRSS"].split()[0])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])



_POLL_SCRIPT = """
import json, sys, threading, time, httpx
url, token, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
ms = []
with httpx.Client(base_url=url, headers={"Authorization": "token " + token}, timeout=60) as http:
    while not stop.is_set():
        sent = time.perf_counter()
        http.get("api/status")
        ms.append((time.perf_counter() - sent) * 1000)
        stop.wait(interval)
print(json.dumps(ms))
"""


class StatusPoller:
    """Jupyter's ``api/status`` every ``interval`` s while a ``with`` block runs, from a
    process of its own: this one's own work (building megabyte bodies) must not count as
    the server's latency."""

    def __init__(self, url: str, token: str, interval: float = 0.02) -> None:
        self.args = [sys.executable, "-c", _POLL_SCRIPT, url, token, str(interval)]
        self.ms: list[float] = []

    def __enter__(self) -> StatusPoller:
        self._proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # it has started polling
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._proc.communicate("", timeout=120)
        self.ms = json.loads(out or "[]")


def probe_refusals(url: str, token: str, pid: int | None, count: int = 20) -> dict[str, Any]:
    """``count`` refused ~1 MiB prompts of made-up words (each new): ``api/status`` latency
    meanwhile, and the server's RSS growth after them (three first, to warm up)."""
    headers = {"Authorization": f"token {token}"}
    made_up = " ".join(f"zq{i:x}vk" for i in range(100_000))
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        statuses = Counter()
        for i in range(3):
            statuses[http.post("infer/generate", json={"prompt": made_up.replace("zq", f"w{i}")}).status_code] += 1
        before = process_figures(pid)[0]
        with StatusPoller(url, token) as poller:
            for i in range(count):
                prompt = made_up.replace("zq", f"{i:02d}")
                statuses[http.post("infer/generate", json={"prompt": prompt}).status_code] += 1
        after = process_figures(pid)[0]
    return {"refused": count, "statuses": dict(statuses), "status_max_ms": round(max(poller.ms), 1),
            "status_p99_ms": round(percentile(poller.ms, 99) or 0, 1),
            "rss_growth_mb": None if before is None or after is None else round(after - before, 1)}


def _hold_subscribers(host: str, port: int, path: str, token: str, n: int, ready: Any, stop: Any) -> None:
    """In a process of its own: ``n`` connections reading ``infer/events`` until ``stop``."""

    async def one(opened: list[int]) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {path}infer/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Authorization: token {token}\r\n\r\n".encode())
        first = await reader.read(65536)
        opened.append(first.startswith(b"HTTP/1.1 200"))
        while await reader.read(65536):
            pass

    async def main() -> None:
        opened: list[int] = []
        tasks = [asyncio.ensure_future(one(opened)) for _ in range(n)]
        while len(opened) < n and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        if sum(opened) == n:
            ready.set()
        await asyncio.to_thread(stop.wait)
        for task in tasks:
            task.cancel()

    asyncio.run(main())


def probe_subscribers(url: str, token: str, subscribers: int = 500, burst: int = 32, max_tokens: int = 32,
                      cycles: int = 2) -> dict[str, Any]:
    """A burst of ``burst`` requests with no live subscriber, then with ``subscribers`` idle
    ones (connected and reading, in another process), ``cycles`` times over: the slowdown
    (the quickest burst with them over the quickest without, so a busy machine's moments
    of load count least), and ``api/status`` meanwhile."""
    import multiprocessing

    async def one_burst() -> float:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"token {token}"}, timeout=300) as http:
            started = time.perf_counter()
            answers = await asyncio.gather(*(http.post("infer/generate", json={
                "prompt": SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)], "max_tokens": max_tokens}) for i in range(burst)))
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:1]
            return time.perf_counter() - started

    asyncio.run(one_burst())  # warm up
    parsed = httpx.URL(url)
    context = multiprocessing.get_context("spawn")
    alone: list[float] = []
    watched: list[float] = []
    status_ms: list[float] = []
    for _ in range(cycles):
        alone += [asyncio.run(one_burst()) for _ in range(2)]
        ready, stop = context.Event(), context.Event()
        holder = context.Process(target=_hold_subscribers, daemon=True, args=(
            parsed.host, parsed.port, parsed.path, token, subscribers, ready, stop))
        holder.start()
        try:
            if not ready.wait(120):
                return {"error": f"could not open {subscribers} subscribers (InferApp.max_event_subscribers?)"}
            with StatusPoller(url, token) as poller:
                watched += [asyncio.run(one_burst()) for _ in range(2)]
            status_ms += poller.ms
        finally:
            stop.set()
            holder.join(10)
    return {"subscribers": subscribers, "burst": burst, "alone_s": round(min(alone), 2),
            "watched_s": round(min(watched), 2), "slowdown": round(min(watched) / min(alone), 2),
            "runs_s": {"alone": [round(t, 2) for t in alone], "watched": [round(t, 2) for t in watched]},
            "status_max_ms": round(max(status_ms), 1), "status_p99_ms": round(percentile(status_ms, 99) or 0, 1)}
