"""When the requests of a burst or a load test are sent: at once, or as Poisson arrivals."""

from __future__ import annotations

import random


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Send offsets in seconds: all zero, or Poisson arrivals (exponential gaps) at ``rate``/s."""
    if not rate or rate <= 0:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
