"""Engines: ``hf`` (Hugging Face causal LMs), ``simulated`` (offline), and ``auto``."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ..values.config import ServiceConfig
from ..values.engine_info import EngineInfo
from .base import Batch, Engine, KVUsage, RowOutput, RowTable, Sampled, StepPlan

__all__ = ["Batch", "Engine", "EngineInfo", "KVUsage", "RowOutput", "RowTable", "Sampled", "StepPlan", "load_engine"]

log = logging.getLogger(__name__)
# A server logs this as a warning; an engine embedded in a kernel says it once, quietly
# (client/embedded.py), since its status carries the reason.
FALLBACK_MESSAGE = "jupyter_infer: falling back to the simulated engine (%s)"


def load_engine(config: ServiceConfig) -> Engine:
    """Build the configured engine; ``auto`` falls back to ``simulated`` and says why."""
    if config.engine == "simulated":
        return _simulated(config)
    try:
        return _hf(config, auto=config.engine == "auto")
    except Exception as err:
        if config.engine == "hf":
            raise
        reason = str(err) if "InferApp.draft_model" in str(err) else \
            f"could not load {config.model!r} with transformers: {_short(err)}"
        log.warning(FALLBACK_MESSAGE, reason)
        return _simulated(config, fallback_reason=reason)


def _simulated(config: ServiceConfig, fallback_reason: str | None = None) -> Engine:
    from .simulated.simulated_engine import SimulatedEngine

    return SimulatedEngine(
        seed=config.seed,
        token_delay_ms=config.simulated_token_delay_ms,
        prefill_ms_per_token=config.simulated_prefill_ms_per_token,
        fallback_reason=fallback_reason,
    )


def _hf(config: ServiceConfig, *, auto: bool) -> Engine:
    from .hf.hf_engine import HFEngine

    model, local_only = _local_or_hub(config.model, auto)
    draft, draft_local_only = _local_or_hub(config.draft_model, auto) if config.speculation == "draft" else ("", True)
    return HFEngine(
        model,
        device=config.device,
        dtype=config.dtype,
        num_threads=config.num_threads,
        local_files_only=local_only,
        draft_local_files_only=draft_local_only,
        generation_defaults=config.generation_defaults,
        split_reasoning=config.split_reasoning,
        tool_call_format=config.tool_call_format,
        prefix_cache_mb=config.prefix_cache_mb,
        prepack_weights=config.prepack_weights,
        quantize=config.quantize,
        draft_model=draft,
    )


def _local_or_hub(name: str, auto: bool) -> tuple[str, bool]:
    """A model's directory, or its hub id; and whether to look in the local cache only (a
    directory, an offline hub, or auto mode with the hub unreachable: from_pretrained then
    fails at once instead of retrying until a timeout)."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return str(folder), True
    return name, _hub_offline() or (auto and not _hub_reachable())


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"} for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_reachable(timeout: float = 1.5) -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{type(err).__name__}: {text[:300]}"
