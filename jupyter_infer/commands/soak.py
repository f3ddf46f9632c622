"""``jupyter infer loadgen --soak``: rounds of ordinary and hostile traffic against a real
server, and what each round left behind in it.

Each round sends ``-n`` streamed requests at ``--rate`` (a fifth of them leave after their
first token, as impatient clients do) alongside abuse: 1 MiB prompts, 100 MB bodies, lone
surrogates, deeply nested JSON, cookie-only GET streams, bodies trickling in at a byte a
second, and event subscribers that come and go. Meanwhile it polls Jupyter's own
``api/status``. After each round, once the server is idle, it reads the server process's
RSS, open file descriptors and threads (Linux ``/proc``). A request is *lost* when it got
no answer, or not the one it should have (a 5xx, a hang, a refusal that was not one).

This module drives the rounds (``Soak``) and the command; the probes run before them are
in ``soak_probes``, the figures and their summary in ``soak_report``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from typing import Any

import httpx

from ..values.prompts import SAMPLE_PROMPTS
from .soak_probes import probe_refusals, probe_subscribers, process_figures
from .soak_report import Round, format_report, report

MIB_PROMPT = "zq vk lorem ipsum dolor sit amet " * 31_000  # ~1 MB of words, under the 1 MiB body limit


class Soak:
    """Rounds of ordinary and hostile traffic against the server at ``url``."""

    def __init__(self, url: str, token: str, pid: int | None, *, seed: int = 0, body_timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.pid = pid
        self.rng = random.Random(seed)
        self.body_timeout_s = body_timeout_s
        host, _, port = httpx.URL(self.url).netloc.decode().partition(":")
        self.host, self.port = host, int(port or 80)
        self.base_path = httpx.URL(self.url).path

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"token {self.token}"} if "cookies" not in kwargs else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=120, **kwargs)

    async def run_round(self, n: int, rate: float, max_tokens: int) -> Round:
        record = Round()
        started = time.monotonic()
        done = asyncio.Event()
        polled = threading.Event()
        poller = threading.Thread(target=self.poll_status, args=(record, polled), daemon=True)
        poller.start()
        async with self.client(limits=httpx.Limits(max_connections=200)) as http:
            await http.get("infer/status")  # the login cookie, for the cookie-only attempts
            cookies = http.cookies
            watchers = [asyncio.ensure_future(self.watch_events(record, done)) for _ in range(5)]
            tasks = []
            at = 0.0
            for i in range(n):
                at += self.rng.expovariate(rate) if rate > 0 else 0.0
                tasks.append(self.later(at, self.generate(http, record, max_tokens, leave_early=i % 5 == 4)))
                if i % 10 == 0:
                    tasks += [self.later(at, attack(http, record)) for attack in self.attacks(cookies)]
            if n >= 10:
                tasks += [self.later(0.0, self.trickle(record)) for _ in range(10)]
            await asyncio.gather(*tasks)
            done.set()
            await asyncio.gather(*watchers)
            polled.set()
            await asyncio.to_thread(poller.join)
            await self.wait_idle(http)
        record.wall_s = time.monotonic() - started
        record.rss_mb, record.fds, record.threads = process_figures(self.pid)
        return record

    @staticmethod
    async def later(delay: float, job: Any) -> None:
        await asyncio.sleep(delay)
        await job

    # -- ordinary traffic -------------------------------------------------------------------
    async def generate(self, http: httpx.AsyncClient, record: Round, max_tokens: int, leave_early: bool) -> None:
        kind = "leaves early" if leave_early else "stream"
        record.sent[kind] += 1
        body = {"prompt": self.rng.choice(SAMPLE_PROMPTS), "max_tokens": self.rng.randint(4, max_tokens),
                "temperature": 0.7}
        try:
            async with http.stream("POST", "infer/generate_stream", json=body) as response:
                text = ""
                async for chunk in response.aiter_text():
                    text += chunk
                    if leave_early and "event: token" in text:
                        return  # closing the response mid-stream: the server must cancel it
                if response.status_code != 200 or "event: done" not in text:
                    record.lost[f"{kind}: {response.status_code} {text[-80:]!r}"] += 1
        except httpx.HTTPError as err:
            record.lost[f"{kind}: {type(err).__name__}"] += 1

    async def watch_events(self, record: Round, done: asyncio.Event) -> None:
        """A panel that opens infer/events, reads for a while, and reconnects."""
        async with self.client() as http:
            while not done.is_set():
                record.sent["events subscriber"] += 1
                try:
                    async with http.stream("GET", "infer/events") as response:
                        if response.status_code != 200:
                            record.lost[f"events subscriber: {response.status_code}"] += 1
                            return
                        try:  # read for a while (a quiet stream sends nothing), then leave
                            await asyncio.wait_for(_drain(response), self.rng.uniform(0.5, 3))
                        except asyncio.TimeoutError:
                            pass
                except httpx.HTTPError as err:
                    record.lost[f"events subscriber: {type(err).__name__}"] += 1

    def poll_status(self, record: Round, done: threading.Event) -> None:
        """Jupyter's own ``api/status`` every 50 ms, from a thread of its own (so that this
        process's busy event loop does not count as the server's latency)."""
        with httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=60) as http:
            while not done.is_set():
                sent = time.perf_counter()
                response = http.get("api/status")
                record.status_ms.append((time.perf_counter() - sent) * 1000)
                if response.status_code != 200:
                    record.lost[f"api/status: {response.status_code}"] += 1
                done.wait(0.05)

    async def wait_idle(self, http: httpx.AsyncClient, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            counts = (await http.get("infer/metrics")).json()["requests"]
            if counts["queued"] == 0 and counts["running"] == 0:
                return
            await asyncio.sleep(0.1)

    # -- abuse ------------------------------------------------------------------------------
    def attacks(self, cookies: httpx.Cookies) -> list[Any]:
        async def expect(record: Round, kind: str, status: int, request: Any) -> None:
            record.sent[kind] += 1
            try:
                response = await request
                if response.status_code != status:
                    record.lost[f"{kind}: {response.status_code}"] += 1
            except httpx.HTTPError as err:
                record.lost[f"{kind}: {type(err).__name__}"] += 1

        def post(http: httpx.AsyncClient, content: bytes, path: str = "infer/generate") -> Any:
            return http.post(path, content=content, headers={"Content-Type": "application/json"})

        async def cookie_only(http: httpx.AsyncClient, record: Round) -> None:
            async with self.client(cookies=cookies) as browser:
                await expect(record, "cookie-only GET stream", 403,
                             browser.get("infer/generate_stream", params={"prompt": "run me"}))

        return [
            lambda http, record: expect(record, "1 MiB prompt", 400, http.post(
                "infer/generate", json={"prompt": f"{self.rng.random()} {MIB_PROMPT}"})),
            lambda http, record: expect(record, "lone surrogate", 400, post(http, b'{"prompt": "\\ud800"}')),
            lambda http, record: expect(record, "deep nesting", 400, post(
                http, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "infer/v1/completions")),
            cookie_only,
            lambda http, record: self.oversized(record),
        ]

    async def oversized(self, record: Round) -> None:
        """Announce a 100 MB body, send 64 KiB of it: the answer must be 413, at once."""
        record.sent["100 MB body"] += 1
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write((f"POST {self.base_path}infer/generate HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Authorization: token {self.token}\r\nContent-Length: 100000000\r\n\r\n").encode()
                         + b"x" * 65536)
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 10)
            if not line.startswith(b"HTTP/1.1 413"):
                record.lost[f"100 MB body: {line[:20]!r}"] += 1
        except (OSError, asyncio.TimeoutError) as err:
            record.lost[f"100 MB body: {type(err).__name__}"] += 1
        finally:
            writer.close()

    async def trickle(self, record: Round) -> None:
        """A body at a byte a second: the server must close it after its body timeout."""
        record.sent["1 byte/s body"] += 1
        reader, writer = await asyncio.open_connection(self.host, self.port)
        started = time.monotonic()
        try:
            writer.write((f"POST {self.base_path}infer/generate HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Authorization: token {self.token}\r\nContent-Length: 10000\r\n\r\n").encode())
            while time.monotonic() - started < self.body_timeout_s + 10:
                writer.write(b"{")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        return  # closed
                except asyncio.TimeoutError:
                    continue
            record.lost["1 byte/s body: still open"] += 1
        except OSError:
            return  # reset: closed too
        finally:
            writer.close()


async def _drain(response: httpx.Response) -> None:
    async for _ in response.aiter_bytes():
        pass


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--soak", action="store_true",
                       help="rounds of ordinary and hostile traffic against a real server; reports requests lost, "
                            "RSS/fds/threads growth and Jupyter's api/status latency")
    group.add_argument("--rounds", type=int, default=5, help="soak rounds, -n requests each (default 5)")
    group.add_argument("--pid", type=int, help="with --url: the server's process id, for RSS, fds and threads")
    group.add_argument("--subscribers", type=int, default=500,
                       help="idle infer/events subscribers for the burst probe (default 500; 0 skips the probes)")


def run(args: argparse.Namespace) -> int:
    from ..kernel.launcher import LocalServer

    body_timeout_s = 3.0
    local = None
    if args.url:
        url, token, pid = args.url, args.token or "", args.pid
    else:
        options: dict[str, Any] = {"engine": args.engine, "body_timeout_s": body_timeout_s,
                                   "max_event_subscribers": args.subscribers + 64,
                                   "max_queue_size": max(256, args.requests)}
        if args.model:
            options["model"] = args.model
        if args.engine == "simulated" or args.engine == "auto" and not args.model:
            options["simulated_token_delay_ms"] = list(args.token_delay_ms)
        local = LocalServer(**options)
        local.start()
        url, token, pid = local.url, local.token, local.pid
    print(f"soak: {args.rounds} rounds of {args.requests} streamed requests at {args.rate:g} req/s, with abuse, "
          f"against {url}" + (f" (pid {pid})" if pid else ""))
    soak = Soak(url, token, pid, seed=args.seed, body_timeout_s=body_timeout_s if local else 30.0)
    rounds: list[Round] = []
    probes: dict[str, Any] = {}
    try:
        if args.subscribers > 0:
            probes["refusals"] = probe_refusals(url, token, pid)
            print(f"probe: 20 refused 1 MiB prompts: {probes['refusals']}", flush=True)
            probes["subscribers"] = probe_subscribers(url, token, args.subscribers)
            print(f"probe: a 32-request burst with {args.subscribers} idle subscribers: {probes['subscribers']}",
                  flush=True)
        for i in range(args.rounds):
            rounds.append(asyncio.run(soak.run_round(args.requests, args.rate, args.max_tokens)))
            r = rounds[-1]
            print(f"  round {i}: {sum(r.sent.values())} sent, {sum(r.lost.values())} lost, RSS {r.rss_mb or 0:.1f} MB",
                  flush=True)
    finally:
        if local is not None:
            local.stop()
    summary = {**report(rounds), "probes": probes}
    print("\n" + format_report(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0 if not summary["lost"] else 1
