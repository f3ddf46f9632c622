"""One source for the service's configuration: every knob, its default and its check.

``InferApp``'s traits take their defaults from here, the embedded client uses the same
defaults, and ``ServiceConfig`` resolves what depends on other knobs (``max_batch_size=0``
picks for the mode) in one place. A bad value raises ``ValueError`` with a message that
names the ``InferApp`` option to fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

ENGINES = ("auto", "hf", "simulated")
MODES = ("continuous", "window")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_MODEL = "sshleifer/tiny-gpt2"
# Measured best on CPU (docs/benchmark.md): the classic batcher closes at 16, continuous
# batching keeps gaining up to 32 rows.
DEFAULT_BATCH_SIZE = {"window": 16, "continuous": 32}
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass(frozen=True)
class ServiceConfig:
    # -- the engine ---------------------------------------------------------------------------
    engine: str = "auto"
    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    num_threads: int = 0  # 0: pick for this machine
    seed: int = 0
    simulated_token_delay_ms: tuple[float, float] = (10.0, 40.0)
    simulated_prefill_ms_per_token: float = 0.2
    # -- scheduling -----------------------------------------------------------------------------
    mode: str = "continuous"
    batch_window_ms: float = 50.0
    max_batch_size: int = 0  # 0: DEFAULT_BATCH_SIZE[mode]
    max_queue_size: int = 256
    max_new_tokens: int = 512
    max_prompt_tokens: int = 2048
    max_prefill_tokens: int = 4096
    idle_admit_delay_ms: float = 5.0
    # -- records and live events -----------------------------------------------------------------
    keep_records: int = 1000
    max_event_subscribers: int = 64
    event_buffer: int = 2048  # events a live subscriber may fall behind before it loses some

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ValueError(f"InferApp.{name} must be {rule}; got {getattr(self, name)!r}.")

        _set(self, "device", self.device.strip().lower())
        _set(self, "model", self.model.strip())
        _set(self, "simulated_token_delay_ms", tuple(self.simulated_token_delay_ms))
        if self.engine not in ENGINES:
            fail("engine", f"one of {', '.join(ENGINES)}")
        if self.mode not in MODES:
            fail("mode", f"one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            fail("dtype", f"one of {', '.join(DTYPES)}")
        if not _DEVICE.fullmatch(self.device):
            fail("device", "auto, cpu, cuda, cuda:N or mps")
        if not self.model:
            raise ValueError("InferApp.model is empty: give a Hugging Face model id or a directory.")
        for name in ("max_queue_size", "max_new_tokens", "max_prompt_tokens", "max_prefill_tokens",
                     "keep_records", "max_event_subscribers", "event_buffer"):
            if getattr(self, name) < 1:
                fail(name, "at least 1")
        if self.max_batch_size < 0:
            fail("max_batch_size", "0 (pick for the mode) or more")
        if self.num_threads < 0:
            fail("num_threads", "0 (auto) or more")
        for name in ("batch_window_ms", "idle_admit_delay_ms", "simulated_prefill_ms_per_token"):
            if not getattr(self, name) >= 0 or math.isinf(getattr(self, name)):  # NaN fails too
                fail(name, "0 or more")
        low_high = self.simulated_token_delay_ms
        if len(low_high) != 2 or not 0 <= low_high[0] <= low_high[1]:
            fail("simulated_token_delay_ms", "two numbers [low, high] with 0 <= low <= high")

    @property
    def batch_size(self) -> int:
        """``max_batch_size`` with 0 resolved for the mode."""
        return self.max_batch_size or DEFAULT_BATCH_SIZE[self.mode]

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of one knob (``InferApp``'s traits take theirs from here)."""
        return next(f.default for f in fields(cls) if f.name == name)


def _set(config: ServiceConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen dataclass in __post_init__
