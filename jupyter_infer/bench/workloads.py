"""The benchmark's workloads: who asks for what, and when.

Every contender gets exactly the same prompts (same text, so the same token ids) and the
same number of new tokens per request; EOS is ignored everywhere, so token counts match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..client import arrival_times
from ..loadgen import Arrival
from ..prompts import SAMPLE_PROMPTS

MIXED_CYCLE = (8, 16, 32, 64)


@dataclass(frozen=True)
class Workload:
    name: str  # burst | mixed | open | http
    description: str
    arrivals: list[Arrival]

    @property
    def closed(self) -> bool:
        """Everyone arrives at once (a padded batch can serve it)."""
        return all(a.at == 0 for a in self.arrivals)

    @property
    def total_tokens(self) -> int:
        return sum(a.max_tokens for a in self.arrivals)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "requests": len(self.arrivals),
            "new_tokens": [a.max_tokens for a in self.arrivals],
            "total_new_tokens": self.total_tokens,
            "arrivals_s": [a.at for a in self.arrivals],
        }


def bench_prompts(count_tokens: Callable[[str], int], n: int, target: int = 20) -> list[str]:
    """``n`` prompts of ``target-2 .. target+2`` tokens: runs of words from the sample prompts."""
    words = " ".join(SAMPLE_PROMPTS).split()
    prompts = []
    for i in range(n):
        want = target - 2 + i % 5
        start = (i * 11) % len(words)
        text = ""
        for j in range(len(words)):
            candidate = (text + " " + words[(start + j) % len(words)]).strip()
            if count_tokens(candidate) > want:
                break
            text = candidate
        prompts.append(text)
    return prompts


def burst(count_tokens: Callable[[str], int], n: int = 16, new_tokens: int = 32) -> Workload:
    prompts = bench_prompts(count_tokens, n)
    return Workload(
        "burst", f"{n} requests at once, ~20-token prompts, {new_tokens} new tokens each",
        [Arrival(0.0, p, new_tokens) for p in prompts],
    )


def mixed(count_tokens: Callable[[str], int], n: int = 32, cycle: tuple[int, ...] = MIXED_CYCLE) -> Workload:
    prompts = bench_prompts(count_tokens, n)
    return Workload(
        "mixed", f"{n} requests at once, outputs cycling {'/'.join(map(str, cycle))} tokens",
        [Arrival(0.0, p, cycle[i % len(cycle)]) for i, p in enumerate(prompts)],
    )


def open_loop(count_tokens: Callable[[str], int], n: int, rate: float, new_tokens: int = 32, seed: int = 0) -> Workload:
    """Poisson arrivals at ``rate`` req/s (the same seeded arrival times for every contender)."""
    prompts = bench_prompts(count_tokens, n)
    arrivals = [Arrival(round(at, 6), p, new_tokens) for at, p in zip(arrival_times(n, rate, seed), prompts, strict=True)]
    return Workload(
        "open", f"{n} requests, Poisson arrivals at {rate:.2f} req/s (~70% of capacity), {new_tokens} new tokens each",
        arrivals,
    )


def over_http(base: Workload) -> Workload:
    return Workload("http", base.description + ", through the real server over HTTP + SSE", base.arrivals)
