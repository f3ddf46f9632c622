"""``jupyter infer loadgen``: open-loop traffic with Poisson arrivals; latency percentiles.

The seed's ``simulate_traffic``: ``-n`` requests arrive at ``--rate`` requests per second
(exponential gaps, seeded), each with a prompt of random length (one to four of the sample
prompts joined) and a random output length in ``[--min-tokens, --max-tokens]``. It drives
an in-process ``InferenceService`` by default, or a running server over HTTP + SSE with
``--url``/``--token``, and prints TTFT and latency p50/p95/p99 and throughput.

This module also owns the small HTTP/SSE client (``HTTPTarget``) that ``demo`` and
``bench`` use to drive a server the way any client would: standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlencode, urlparse

from .engine.simulated_answers import SAMPLE_PROMPTS
from .metrics import percentile


# -- workload --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """One request of a workload: when it arrives (seconds after the start) and what it asks."""

    at: float
    prompt: str
    max_tokens: int


def make_workload(
    n: int, rate: float, *, min_tokens: int = 16, max_tokens: int = 64, seed: int = 0,
    prompts: Sequence[str] = SAMPLE_PROMPTS, max_parts: int = 4,
) -> list[Arrival]:
    """``n`` Poisson arrivals at ``rate`` req/s (``rate <= 0``: all at once), seeded.

    Prompt lengths vary because each prompt joins 1..``max_parts`` sample prompts.
    """
    if n < 1 or min_tokens < 1 or max_tokens < min_tokens:
        raise ValueError("need n >= 1 and 1 <= min_tokens <= max_tokens")
    rng = random.Random(seed)
    at = 0.0
    out = []
    for _ in range(n):
        parts = rng.randint(1, max_parts)
        prompt = " ".join(rng.choice(prompts) for _ in range(parts))
        out.append(Arrival(round(at, 6), prompt, rng.randint(min_tokens, max_tokens)))
        if rate > 0:
            at += rng.expovariate(rate)
    return out


# -- results ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a client saw for one request (times from the moment it was sent)."""

    ok: bool
    ttft_ms: float | None = None
    latency_ms: float | None = None
    tokens: int = 0
    error: str | None = None
    batch_id: int | None = None
    batch_size: int | None = None


def summarize(outcomes: Sequence[Outcome], wall_s: float, offered_rate: float | None = None) -> dict[str, Any]:
    """Counts, TTFT/latency percentiles and throughput over a run."""
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft_ms for o in ok if o.ttft_ms is not None]
    latency = [o.latency_ms for o in ok if o.latency_ms is not None]
    tokens = sum(o.tokens for o in ok)

    def dist(values: list[float]) -> dict[str, float | None]:
        return {
            "p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99),
            "mean": sum(values) / len(values) if values else None,
        }

    errors: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            errors[o.error or "error"] = errors.get(o.error or "error", 0) + 1
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failed": len(outcomes) - len(ok),
        "errors": errors,
        "wall_s": wall_s,
        "offered_rate": offered_rate,
        "achieved_rate": len(ok) / wall_s if wall_s > 0 else None,
        "tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "ttft_ms": dist(ttft),
        "latency_ms": dist(latency),
    }


# -- in-process ------------------------------------------------------------------------------
async def drive_scheduler(scheduler: Any, workload: Sequence[Arrival], **params: Any) -> tuple[list[Outcome], float]:
    """Send ``workload`` to a started ``Scheduler`` at its arrival times; wait for every answer.

    ``params`` go to ``SamplingParams`` (e.g. ``temperature``). Returns the outcomes, in
    workload order, and the wall time from the first arrival to the last answer.
    """
    from .errors import InferError
    from .request import Request, SamplingParams

    await scheduler.wait_ready()
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(item: Arrival) -> Outcome:
        delay = start + item.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.monotonic()
        first: float | None = None
        try:
            stream = await scheduler.submit(Request(item.prompt, SamplingParams(max_tokens=item.max_tokens, **params)))
            async for _ in stream:
                if first is None:
                    first = time.monotonic()
            result = await stream.result()
        except InferError as err:
            return Outcome(False, error=type(err).__name__)
        done = time.monotonic()
        # The scheduler's own first-token time: a first token whose text is still held back
        # (half a UTF-8 character, a special token) reaches no stream event, yet it came.
        ttft = result.ttft_ms if result.ttft_ms is not None else (None if first is None else (first - sent) * 1000)
        return Outcome(
            True, ttft, (done - sent) * 1000,
            result.completion_tokens, batch_id=result.batch_id, batch_size=result.batch_size,
        )

    outcomes = await asyncio.gather(*(one(item) for item in workload))
    return list(outcomes), loop.time() - start


# -- over HTTP -------------------------------------------------------------------------------
class HTTPError(RuntimeError):
    """A non-2xx answer; ``message`` is the server's own explanation when it gave one."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass
class StreamedAnswer:
    """One ``generate_stream`` call as the client saw it."""

    id: str | None
    text: str
    fragments: int
    ttft_s: float | None
    total_s: float
    fragment_times: list[float] = field(default_factory=list)


class HTTPTarget:
    """A jupyter_infer server at ``url`` (its base URL), with Jupyter's token."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0) -> None:
        self.url = url if url.endswith("/") else url + "/"
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"expected an http(s) URL like http://127.0.0.1:8888/; got {url!r}")
        self._parsed = parsed
        self.token = token
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._parsed.scheme == "https" else http.client.HTTPConnection
        return cls(self._parsed.hostname, self._parsed.port, timeout=self.timeout)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        return {**headers, **(extra or {})}

    def _open(self, method: str, path: str, body: dict | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection()
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers({"Content-Type": "application/json"} if data is not None else None)
        conn.request(method, self._parsed.path + path, body=data, headers=headers)
        resp = conn.getresponse()
        if resp.status >= 300:
            raw = resp.read()
            conn.close()
            try:
                message = json.loads(raw).get("message") or raw.decode(errors="replace")
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace")[:500] or resp.reason
            raise HTTPError(resp.status, message)
        return conn, resp

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        conn, resp = self._open(method, path, body)
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path + (f"?{urlencode(query)}" if query else ""))

    def generate(self, body: dict) -> dict:
        """``POST infer/generate``: the JSON answer."""
        return self.request("POST", "infer/generate", body)

    def stream(self, body: dict, on_fragment: Callable[[str], None] | None = None) -> StreamedAnswer:
        """``POST infer/generate_stream``: read the SSE stream to its ``done`` event."""
        sent = time.monotonic()
        conn, resp = self._open("POST", "infer/generate_stream", body)
        text: list[str] = []
        times: list[float] = []
        request_id = None
        try:
            for event, event_id, data in sse_events(resp):
                if event == "token":
                    times.append(time.monotonic() - sent)
                    request_id = event_id or request_id
                    text.append(data)
                    if on_fragment is not None:
                        on_fragment(data)
                elif event == "error":
                    try:
                        message = json.loads(data).get("message", data)
                    except ValueError:
                        message = data
                    raise HTTPError(500, message)
                elif event == "done":
                    break
        finally:
            conn.close()
        return StreamedAnswer(request_id, "".join(text), len(times), times[0] if times else None,
                              time.monotonic() - sent, times)


def sse_events(resp: Any) -> Iterator[tuple[str, str | None, str]]:
    """Parse a text/event-stream: yield ``(event, id, data)``; comments (keepalives) skipped."""
    event, event_id, data = "message", None, []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, event_id, "\n".join(data)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value


def drive_http(target: HTTPTarget, workload: Sequence[Arrival], **params: Any) -> tuple[list[Outcome], float]:
    """Send ``workload`` over SSE, one thread per request, each at its arrival time."""
    outcomes: list[Outcome | None] = [None] * len(workload)
    start = time.monotonic()

    def one(i: int, item: Arrival) -> None:
        try:
            answer = target.stream({"prompt": item.prompt, "max_tokens": item.max_tokens, **params})
            outcomes[i] = Outcome(True, None if answer.ttft_s is None else answer.ttft_s * 1000,
                                  answer.total_s * 1000, answer.fragments)
        except HTTPError as err:
            outcomes[i] = Outcome(False, error=f"HTTP {err.status}")
        except OSError as err:
            outcomes[i] = Outcome(False, error=type(err).__name__)

    threads = []
    for i, item in enumerate(workload):
        delay = start + item.at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i, item), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return [o or Outcome(False, error="no answer") for o in outcomes], time.monotonic() - start


# -- report ----------------------------------------------------------------------------------
def format_summary(summary: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    lines = [
        f"requests   {summary['ok']}/{summary['requests']} ok"
        + (f", failed: {summary['errors']}" if summary["failed"] else ""),
        f"duration   {summary['wall_s']:.2f} s"
        + (f"   offered {summary['offered_rate']:.2f} req/s" if summary.get("offered_rate") else "")
        + (f"   achieved {summary['achieved_rate']:.2f} req/s" if summary.get("achieved_rate") else ""),
        f"throughput {summary['tokens']} tokens generated, "
        f"{summary['tokens_per_s'] or 0:,.1f} tokens/s",
        "",
        f"{'':12}{'p50':>10}{'p95':>10}{'p99':>10}{'mean':>10}",
    ]
    for label, key in (("TTFT ms", "ttft_ms"), ("latency ms", "latency_ms")):
        d = summary[key]
        lines.append(f"{label:12}" + "".join(f"{ms(d[k]):>10}" for k in ("p50", "p95", "p99", "mean")))
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--requests", type=int, default=100, help="how many requests (default 100)")
    parser.add_argument("--rate", type=float, default=5.0, help="mean arrivals per second; 0 = all at once (default 5)")
    parser.add_argument("--min-tokens", type=int, default=16, help="shortest output asked for (default 16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="longest output asked for (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seeds arrivals, prompts and lengths (default 0)")
    parser.add_argument("--json", metavar="PATH", help="also write the summary and every outcome as JSON")
    remote = parser.add_argument_group("a running server (instead of in-process)")
    remote.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8888/")
    remote.add_argument("--token", help="the server's Jupyter token")
    local = parser.add_argument_group("in-process engine and scheduler")
    local.add_argument("--engine", choices=("auto", "hf", "simulated"), default="auto")
    local.add_argument("--model", help="a Hugging Face model id or a local folder (see `jupyter infer make-model`)")
    local.add_argument("--mode", choices=("continuous", "window"), default="continuous")
    local.add_argument("--max-batch-size", type=int, default=16)
    local.add_argument("--batch-window-ms", type=float, default=50.0)
    local.add_argument("--num-threads", type=int, default=0, help="torch CPU threads (0: pick for this machine)")
    local.add_argument("--token-delay-ms", type=float, nargs=2, metavar=("LO", "HI"), default=(10.0, 40.0),
                       help="simulated engine: per-step delay range (0 0 for a pure scheduler load test)")
    local.add_argument("--prefill-ms-per-token", type=float, default=0.2, help="simulated engine: prefill cost")


def run(args: argparse.Namespace) -> int:
    workload = make_workload(args.requests, args.rate, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                             seed=args.seed)
    offered = args.rate if args.rate > 0 else None
    print(f"loadgen: {args.requests} requests, "
          + (f"Poisson arrivals at {args.rate:g} req/s" if offered else "all at once")
          + f", {args.min_tokens}-{args.max_tokens} new tokens each, seed {args.seed}")
    if args.url:
        target = HTTPTarget(args.url, args.token)
        try:
            status = target.get("infer/status")
        except (HTTPError, OSError) as err:
            print(f"error: cannot reach {args.url}: {err}. Check --url and --token.", file=sys.stderr)
            return 1
        print(f"target:  {target.url} (engine {status.get('engine')}, model {status.get('model')}, "
              f"mode {status.get('mode')})\n")
        outcomes, wall_s = drive_http(target, workload)
    else:
        outcomes, wall_s = asyncio.run(_run_local(args, workload))
    summary = summarize(outcomes, wall_s, offered)
    print(format_summary(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "outcomes": [asdict(o) for o in outcomes]}, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0 if summary["ok"] else 1


async def _run_local(args: argparse.Namespace, workload: list[Arrival]) -> tuple[list[Outcome], float]:
    from .engine import DEFAULT_MODEL, EngineConfig
    from .scheduler import SchedulerConfig
    from .service import InferenceService

    service = InferenceService(
        EngineConfig(
            engine=args.engine, model=args.model or DEFAULT_MODEL, num_threads=args.num_threads,
            token_delay_ms=tuple(args.token_delay_ms), prefill_ms_per_token=args.prefill_ms_per_token,
        ),
        SchedulerConfig(
            mode=args.mode, max_batch_size=args.max_batch_size, batch_window_ms=args.batch_window_ms,
            max_queue_size=max(256, len(workload)),
            max_new_tokens=max(512, args.max_tokens),
        ),
    )
    service.start()
    try:
        await service.scheduler.wait_ready()
        status = service.status()
        print(f"target:  in-process, engine {status['engine']}, model {status['model']}, mode {status['mode']}, "
              f"max batch {args.max_batch_size}"
              + (f"\n         (fallback: {status['fallback_reason']})" if status.get("fallback_reason") else "")
              + "\n")
        return await drive_scheduler(service.scheduler, workload)
    finally:
        await service.stop()
