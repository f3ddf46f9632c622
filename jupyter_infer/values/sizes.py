"""How a loaded model's weights are told to a person: their format and sizes (the log's ready
line, ``%infer_status``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def readable_bytes(n: int) -> str:
    """``1.50 GiB`` from a GiB up, ``424 MiB`` below."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def weights_format(details: Mapping[str, Any], dtype: str | None) -> str | None:
    """What the weights are held as: the quantized format (int4, int8), else the dtype."""
    quantize = details.get("quantize")
    return quantize if quantize not in (None, "none") else dtype
