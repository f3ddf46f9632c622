"""``jupyter infer loadgen``: open-loop traffic with Poisson arrivals; latency percentiles.

The seed's ``simulate_traffic``: ``-n`` requests arrive at ``--rate`` requests per second
(exponential gaps, seeded), each with a prompt of random length (one to four of the sample
prompts joined) and a random output length in ``[--min-tokens, --max-tokens]``. It drives
an in-process ``InferenceService`` by default, or a running server over HTTP + SSE with
``--url``/``--token`` (through ``jupyter_infer.Client``, as any client would), and prints
TTFT and latency p50/p95/p99 and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InferError
from ..kernel.client import AsyncTokenStream, Client, arrival_times
from ..values.metrics import percentile
from ..values.prompts import SAMPLE_PROMPTS


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
    out = []
    for at in arrival_times(n, rate, seed):
        parts = rng.randint(1, max_parts)
        prompt = " ".join(rng.choice(prompts) for _ in range(parts))
        out.append(Arrival(round(at, 6), prompt, rng.randint(min_tokens, max_tokens)))
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

    errors = dict(Counter(o.error or "error" for o in outcomes if not o.ok))
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
async def drive_service(service: Any, workload: Sequence[Arrival], **params: Any) -> tuple[list[Outcome], float]:
    """Send ``workload`` to a started ``InferenceService`` at its arrival times; wait for every answer.

    ``params`` go to ``SamplingParams`` (e.g. ``temperature``). Returns the outcomes, in
    workload order, and the wall time from the first arrival to the last answer.
    """
    from ..values.request import Request, SamplingParams

    await service.wait_ready()
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(item: Arrival) -> Outcome:
        delay = start + item.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.monotonic()
        first: float | None = None
        try:
            stream = await service.submit(Request(item.prompt, SamplingParams(max_tokens=item.max_tokens, **params)))
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


# -- through a client (over HTTP + SSE) -------------------------------------------------------
def drive_http(client: Client, workload: Sequence[Arrival], **params: Any) -> tuple[list[Outcome], float]:
    """Stream ``workload`` through ``client``: one ``astream`` task per request, on its I/O loop.

    Each request is sent at its arrival time. TTFT is its first token fragment received
    minus the moment it was sent, latency its end minus that moment, both as the client saw
    them; ``tokens`` is the server's count from the stream's final result (its fragments
    on an older server that sends none). Returns the outcomes, in workload order, and the
    wall time from the first send to the last answer.
    """

    async def drive() -> tuple[list[Outcome], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        streams: list[AsyncTokenStream] = []

        async def one(item: Arrival) -> Outcome:
            delay = start + item.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            stream = client.astream(item.prompt, **{"max_tokens": item.max_tokens, **params})
            streams.append(stream)
            try:
                async for _ in stream:
                    pass
            except InferError as err:
                return Outcome(False, error=type(err).__name__)
            done = stream.completion
            if done is None or done.counted_fragments:  # an older server: no final result
                return Outcome(True, stream.ttft_ms, stream.total_ms, stream.fragments)
            return Outcome(True, stream.ttft_ms, stream.total_ms, done.completion_tokens,
                           batch_id=done.batch_id, batch_size=done.batch_size)

        outcomes = await asyncio.gather(*(one(item) for item in workload))
        sent = [s.sent_at for s in streams if s.sent_at is not None]
        done = [s.finished_at for s in streams if s.finished_at is not None]
        wall = max(done) - min(sent) if sent and done else loop.time() - start
        return list(outcomes), wall

    return client.run(drive())


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
    from . import soak

    soak.add_arguments(parser.add_argument_group("soak (a real server, ordinary and hostile traffic)"))


def run(args: argparse.Namespace) -> int:
    if args.soak:
        from . import soak

        return soak.run(args)
    workload = make_workload(args.requests, args.rate, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                             seed=args.seed)
    offered = args.rate if args.rate > 0 else None
    print(f"loadgen: {args.requests} requests, "
          + (f"Poisson arrivals at {args.rate:g} req/s" if offered else "all at once")
          + f", {args.min_tokens}-{args.max_tokens} new tokens each, seed {args.seed}")
    if args.url:
        with Client(args.url, args.token, embedded=False) as client:
            try:
                # The server answers before its engine has loaded; wait, so that the target line
                # names the engine and the first arrivals do not measure the load.
                status = client.wait_ready()
            except InferError as err:
                print(f"error: {err} (check --url and --token)", file=sys.stderr)
                return 1
            print(f"target:  {client.url} (engine {status.get('engine')}, model {status.get('model')}, "
                  f"mode {status.get('mode')})\n")
            outcomes, wall_s = drive_http(client, workload)
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
    from ..service.inference import InferenceService
    from ..values.config import DEFAULT_MODEL, ServiceConfig

    service = InferenceService(ServiceConfig(
        engine=args.engine, model=args.model or DEFAULT_MODEL, num_threads=args.num_threads,
        simulated_token_delay_ms=tuple(args.token_delay_ms),
        simulated_prefill_ms_per_token=args.prefill_ms_per_token,
        mode=args.mode, max_batch_size=args.max_batch_size, batch_window_ms=args.batch_window_ms,
        max_queue_size=max(256, len(workload)), max_new_tokens=max(512, args.max_tokens),
    ))
    service.start()
    try:
        await service.wait_ready()
        status = service.status()
        print(f"target:  in-process, engine {status['engine']}, model {status['model']}, mode {status['mode']}, "
              f"max batch {args.max_batch_size}"
              + (f"\n         (fallback: {status['fallback_reason']})" if status.get("fallback_reason") else "")
              + "\n")
        return await drive_service(service, workload)
    finally:
        await service.stop()
