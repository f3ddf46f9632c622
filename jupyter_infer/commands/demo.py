"""``jupyter infer demo``: watch a real Jupyter server batch requests, in a terminal.

It starts ``jupyter server`` with the extension on a free loopback port (token auth), and
drives it over HTTP with ``jupyter_infer.Client`` (its URL and token given), like the seed's
example.py: one request streamed over SSE (tokens printed as they arrive), a few requests one
after another, then concurrent bursts. A second thread polls ``GET infer/batches`` and prints,
live, how the scheduler groups requests into batches (who joined, who left). It ends with a table of
sequential vs batched latency and throughput, and shuts the server down.

Requests are labelled by phase: S (streamed), Q (one after another), A, B, ... (bursts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngineUnavailable, InferError
from ..kernel.client import Client, Completion
from ..values.prompts import SAMPLE_PROMPTS

BURST_TOKENS = (16, 24, 32, 40)  # varied lengths, so rows visibly leave a continuous batch


# -- terminal ---------------------------------------------------------------------------------
class Terminal:
    """Prints from several threads without tearing lines; colours only on a real terminal."""

    def __init__(self, color: bool) -> None:
        self.color = color
        self.lock = threading.RLock()
        self.width = min(shutil.get_terminal_size((100, 24)).columns, 110)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self.paint(text, "1")

    def dim(self, text: str) -> str:
        return self.paint(text, "2")

    def say(self, text: str = "") -> None:
        with self.lock:
            print(text, flush=True)

    def log(self, text: str, at: float | None = None) -> None:
        """A line of the live log, stamped with seconds since the start (or wall time ``at``)."""
        t = time.monotonic() - self.t0 if at is None else at - self.t0_wall
        self.say(f"  {self.dim(f'{t:6.2f}s')}  {text}")

    def heading(self, text: str) -> None:
        self.say()
        self.say(self.paint(text, "1;36"))


# -- the live batch log -------------------------------------------------------------------------
class BatchWatcher(threading.Thread):
    """Polls ``GET infer/batches``: labels requests as they are queued, logs batches as they close.

    A batch record in ``continuous`` mode is a span of constant membership, so each one
    says who joined and who left; in ``window`` mode a batch is the group admitted together.
    Each line is stamped with the time its batch closed and says when it began.
    (Polling, not ``infer/events``: a lag of one poll is invisible here, and the demo then
    needs nothing from the server beyond its JSON routes.)
    """

    def __init__(self, client: Client, term: Terminal, interval_s: float = 0.1) -> None:
        super().__init__(name="demo-batch-watcher", daemon=True)
        self.client = client
        self.term = term
        self.interval_s = interval_s
        self.labels: dict[str, str] = {}
        self.quiet = True  # record batches without logging them (while tokens stream)
        self.failed: str | None = None
        self._prefix = "?"
        self._counter = 0
        self._last_batch = 0
        self._members: list[str] = []
        self._lock = threading.RLock()
        self._halt = threading.Event()

    def phase(self, prefix: str, quiet: bool = False) -> None:
        """Requests queued from now on are ``<prefix>1``, ``<prefix>2``, ..."""
        self.poll()  # settle the previous phase's labels and batches first
        with self._lock:
            self._prefix, self._counter, self.quiet = prefix, 0, quiet

    def label(self, request_id: str) -> str:
        if request_id not in self.labels:
            self.poll()
        with self._lock:
            return self.labels.get(request_id, request_id[-6:])

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            try:
                view = self.client.batches(limit=100)
            except (InferError, ValueError) as err:
                self.failed = f"{type(err).__name__}: {err}"
                return
            for record in sorted(view.get("requests", []), key=lambda r: r["queued_at"]):
                if record["id"] not in self.labels:
                    self._counter += 1
                    self.labels[record["id"]] = f"{self._prefix}{self._counter}"
            for batch in sorted(view.get("batches", []), key=lambda b: b["id"]):
                if batch["id"] > self._last_batch:
                    self._last_batch = batch["id"]
                    self._show(batch)

    def _show(self, batch: dict[str, Any]) -> None:
        if batch["steps"] == 0:
            return  # rows that left in the same step: fold into the next span
        members = [self.labels.get(m, m[-6:]) for m in batch["members"]]
        previous = self._members if set(self._members) & set(members) else []
        self._members = members
        if self.quiet:
            return
        change = []
        if batch.get("mode") == "continuous":
            joined = [m for m in members if m not in previous]
            left = [m for m in previous if m not in members]
            if left:
                change.append(self.term.paint("-" + " -".join(left), "31") + " left")
            if joined:
                change.append(self.term.paint("+" + " +".join(joined), "32") + " joined")
        since = batch["started_at"] - self.term.t0_wall
        span = self.term.dim(f"(from {since:.2f}s: {batch['steps']} steps, {batch['tokens']} tokens)")
        head = self.term.paint(f"batch #{batch['id']:<3}", "33")
        self.term.log(f"{head} size {len(members):>2}: {' '.join(members):<26} {'; '.join(change)} {span}",
                      at=batch.get("ended_at"))

    def close(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)  # before the client closes: no poll after that


# -- phases -------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    wall_s: float = 0.0
    answers: list[Completion] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        n = len(self.answers)

        def mean(values: list[float]) -> float:
            return sum(values) / n if n else 0.0

        tokens = sum(a.completion_tokens for a in self.answers)
        return {
            "phase": self.name,
            "requests": n,
            "wall_s": self.wall_s,
            "avg_latency_ms": mean([_client_ms(a) for a in self.answers]),
            "avg_ttft_ms": mean([a.ttft_ms or 0 for a in self.answers]),
            "avg_batch": mean([a.batch_size for a in self.answers]),
            "tokens_per_s": tokens / self.wall_s if self.wall_s else 0.0,
        }


def _client_ms(answer: Completion) -> float:
    """The request's latency as the client saw it: sent to answered."""
    return ((answer.received_at or 0.0) - (answer.sent_at or 0.0)) * 1000


class Demo:
    def __init__(self, client: Client, term: Terminal, watcher: BatchWatcher, max_tokens: int) -> None:
        self.client = client
        self.term = term
        self.watcher = watcher
        self.max_tokens = max_tokens
        self._prompt = 0

    def next_prompt(self) -> str:
        self._prompt += 1
        return SAMPLE_PROMPTS[(self._prompt - 1) % len(SAMPLE_PROMPTS)]

    def _answer_line(self, answer: Completion) -> str:
        label = self.term.bold(f"{self.watcher.label(answer.id or '?'):<3}")
        prompt = answer.prompt or ""
        short = prompt if len(prompt) <= 44 else prompt[:41] + "..."
        return (f"{label} done   batch #{answer.batch_id:<3} size {answer.batch_size:>2}  "
                f"queued {answer.queued_ms or 0:5.0f} ms  TTFT {answer.ttft_ms or 0:5.0f} ms  "
                f"total {_client_ms(answer):6.0f} ms  {answer.completion_tokens:>2} tok  "
                + self.term.dim(f"\"{short}\""))

    def streamed(self) -> float:
        """One request over SSE; its tokens are printed as they arrive."""
        self.term.heading("1. One request, streamed token by token (POST infer/generate_stream)")
        self.watcher.phase("S", quiet=True)  # the token stream owns the screen for now
        prompt = self.next_prompt()
        self.term.say(f"  prompt: {self.term.bold(prompt)}")
        indent, column = "  | ", 4
        print(self.term.dim(indent), end="", flush=True)

        def show(fragment: str) -> None:
            nonlocal column
            for i, piece in enumerate(fragment.split("\n")):
                if i:
                    print("\n" + self.term.dim(indent), end="")
                    column = len(indent)
                if column + len(piece) > self.term.width and piece.startswith(" "):
                    print("\n" + self.term.dim(indent), end="")
                    column = len(indent)
                    piece = piece.lstrip()
                print(self.term.paint(piece, "32"), end="", flush=True)
                column += len(piece)

        stream = self.client.stream(prompt, max_tokens=self.max_tokens + 16)
        for fragment in stream:
            show(fragment)
        print(flush=True)
        total_s = (stream.total_ms or 0.0) / 1000
        self.term.say(f"  -> {stream.tokens} tokens ({stream.fragments} fragments in {total_s:.2f} s), first after "
                      f"{stream.ttft_ms or 0:.0f} ms ({stream.tokens / max(total_s, 1e-9):.1f} tokens/s "
                      "for a lone request)")
        return total_s

    def sequential(self, n: int) -> Phase:
        self.term.heading(f"2. {n} requests, one after another (POST infer/generate)")
        self.watcher.phase("Q")
        phase = Phase("sequential")
        start = time.monotonic()
        for _ in range(n):
            answer = self.client.generate(self.next_prompt(), max_tokens=self.max_tokens)
            phase.answers.append(answer)
            self.term.log(self._answer_line(answer))
            self.watcher.poll()  # its batch closed as it finished: log it now, in order
        phase.wall_s = time.monotonic() - start
        return phase

    def burst(self, n: int, prefix: str) -> Phase:
        self.term.heading(f"3{prefix.lower()}. A burst of {n} concurrent requests (one connection each)")
        self.watcher.phase(prefix)
        phase = Phase(f"burst of {n}")
        errors: list[str] = []
        jobs = [(self.next_prompt(), BURST_TOKENS[i % len(BURST_TOKENS)] * self.max_tokens // 32) for i in range(n)]

        async def one(prompt: str, tokens: int) -> None:
            try:
                answer = await self.client.agenerate(prompt, max_tokens=max(tokens, 1))
            except InferError as err:
                errors.append(str(err))
                return
            phase.answers.append(answer)
            self.term.log(self._answer_line(answer))  # as each one finishes

        async def burst() -> None:
            await asyncio.gather(*(one(*job) for job in jobs))

        start = time.monotonic()
        asyncio.run(burst())  # a loop of the demo's own: the log lines call the client's sync API
        phase.wall_s = time.monotonic() - start
        self.watcher.poll()  # the burst's last batch records, before the next phase
        if errors:
            self.term.say(f"  {len(errors)} request(s) failed: {errors[0]}")
        return phase

    def table(self, phases: list[Phase]) -> None:
        self.term.heading("4. Sequential vs batched")
        rows = [p.row() for p in phases]
        head = f"  {'phase':<14}{'requests':>9}{'wall s':>9}{'avg latency':>13}{'avg TTFT':>10}{'avg batch':>11}{'tokens/s':>10}"
        self.term.say(self.term.bold(head))
        for r in rows:
            self.term.say(f"  {r['phase']:<14}{r['requests']:>9}{r['wall_s']:>9.2f}{r['avg_latency_ms']:>10.0f} ms"
                          f"{r['avg_ttft_ms']:>7.0f} ms{r['avg_batch']:>11.1f}{r['tokens_per_s']:>10.1f}")
        seq = rows[0]
        if len(rows) > 1 and seq["requests"]:
            big = max(rows[1:], key=lambda r: r["requests"])
            alone = seq["avg_latency_ms"] / 1000 * big["requests"]
            self.term.say()
            self.term.say(
                f"  The {big['phase']} finished in {big['wall_s']:.2f} s, each request taking "
                f"{big['avg_latency_ms'] / 1000:.2f} s on average (alone: {seq['avg_latency_ms'] / 1000:.2f} s).\n"
                f"  One after another they would have needed about {alone:.1f} s: batching served them "
                + self.term.bold(f"{alone / big['wall_s']:.1f}x faster") + f" ({big['tokens_per_s'] / max(seq['tokens_per_s'], 1e-9):.1f}x the tokens/s)."
            )


# -- command line -------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("auto", "hf", "simulated"), default="auto",
                        help="auto (default): hf with the configured model, else the offline simulated engine")
    parser.add_argument("--model", help="a Hugging Face model id or local folder (see `jupyter infer make-model`)")
    parser.add_argument("--mode", choices=("continuous", "window"), help="batching mode (default: the server's)")
    parser.add_argument("--max-batch-size", type=int, help="most requests in one batch (default: the server's)")
    parser.add_argument("--batch-window-ms", type=float, help="window mode: how long a batch waits (default 50)")
    parser.add_argument("--sequential", type=int, default=3, help="requests sent one after another (default 3)")
    parser.add_argument("--bursts", default="4,8", help="sizes of the concurrent bursts (default 4,8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request, about (default 32)")
    parser.add_argument("--token-delay-ms", type=float, nargs=2, metavar=("LO", "HI"),
                        help="simulated engine: per-step delay range (default 10 40)")
    parser.add_argument("--no-color", action="store_true", help="plain text, even on a terminal")


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"engine": args.engine}
    for name in ("model", "mode", "max_batch_size", "batch_window_ms"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.token_delay_ms is not None:
        options["simulated_token_delay_ms"] = list(args.token_delay_ms)
    return options


def run(args: argparse.Namespace) -> int:
    from ..kernel.launcher import LocalServer

    try:
        bursts = [int(b) for b in args.bursts.split(",") if b.strip()]
    except ValueError:
        print(f"error: --bursts takes sizes like 4,8; got {args.bursts!r}", file=sys.stderr)
        return 2
    if args.max_tokens < 1 or args.sequential < 1 or any(b < 1 for b in bursts):
        print("error: --max-tokens, --sequential and burst sizes must be at least 1", file=sys.stderr)
        return 2
    term = Terminal(color=sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR"))
    term.say(term.bold("jupyter infer demo") + ": a real Jupyter server, batching requests as they come")
    term.say(term.dim("  starting jupyter server with the jupyter_infer extension on a free loopback port..."))
    server = LocalServer(**_server_options(args))
    try:
        server.start()
    except (RuntimeError, TimeoutError) as err:
        print(f"error: the server did not start: {err}", file=sys.stderr)
        return 1
    watcher = None
    client = None
    try:
        client = Client(server.url, server.token, embedded=False)
        try:
            status = client.wait_ready(timeout=600)
        except EngineUnavailable as err:
            print(f"error: the engine did not load: {err}", file=sys.stderr)
            return 1
        limits = status.get("limits", {})
        term.say(f"  server {term.bold(server.url)} (token auth), ready in {time.monotonic() - term.t0:.1f} s")
        term.say(f"  engine {term.bold(str(status.get('engine')))}, model {status.get('model')}, "
                 f"mode {term.bold(str(status.get('mode')))}, max batch {limits.get('max_batch_size')}, "
                 f"window {limits.get('batch_window_ms')} ms")
        if status.get("fallback_reason"):
            term.say(term.paint(f"  (auto fell back to the simulated engine: {status['fallback_reason']})", "33"))
            term.say(term.dim("  serve a real model with --engine hf --model DIR (`jupyter infer make-model DIR`)"))
        watcher = BatchWatcher(client, term)
        watcher.poll()
        watcher.start()
        demo = Demo(client, term, watcher, args.max_tokens)
        demo.streamed()
        phases = [demo.sequential(args.sequential)]
        for i, size in enumerate(bursts):
            phases.append(demo.burst(size, chr(ord("A") + i)))
        demo.table(phases)
        return 0
    except KeyboardInterrupt:
        term.say("\n  interrupted")
        return 130
    except InferError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        term.say(term.dim("\n  shutting the server down..."))
        if watcher is not None:
            watcher.close()
        if client is not None:
            client.close()
        server.stop()
        term.say(term.dim(f"  done in {time.monotonic() - term.t0:.1f} s."))
