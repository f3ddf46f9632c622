"""Engines: ``hf`` (Hugging Face causal LMs), ``simulated`` (offline), and ``auto``."""

from __future__ import annotations

import logging

from ..formats.model_source import ModelNotFound, locate
from ..values import load_progress
from ..values.config import DEFAULT_MODEL, ServiceConfig
from ..values.engine_info import EngineInfo
from ..values.request import brief
from .base import Batch, Engine, KVUsage, RowOutput, RowTable, Sampled, StepPlan

__all__ = ["Batch", "Engine", "EngineInfo", "KVUsage", "RowOutput", "RowTable", "Sampled", "StepPlan", "load_engine"]

log = logging.getLogger(__name__)
# A server logs this as a warning; an engine embedded in a kernel says it once, quietly
# (client/embedded.py), since its status carries the reason.
FALLBACK_MESSAGE = "jupyter_infer: falling back to the simulated engine (%s)"


def load_engine(config: ServiceConfig) -> Engine:
    """Build the configured engine. ``auto`` falls back to ``simulated`` (and says why) only
    for the built-in default model: a model the user named that cannot load is a failure that
    says why, never a fluent stand-in."""
    if config.engine == "simulated":
        return _simulated(config)
    load_progress.current().phase("finding the model, importing transformers")
    try:
        return _hf(config)
    except Exception as err:
        if config.engine == "hf" or config.model != DEFAULT_MODEL:
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


def _hf(config: ServiceConfig) -> Engine:
    model = locate(config.model)  # before importing transformers: a mistake is said at once
    try:
        draft = locate(config.draft_model) if config.speculation == "draft" else None
    except ModelNotFound as err:
        raise ModelNotFound(f"InferApp.draft_model {config.draft_model!r} could not be loaded ({err}); "
                            "or set InferApp.speculative = 'ngram' to do without it.") from None
    from ..formats.embedding_checkpoint import embedding_spec

    spec = embedding_spec(model.path)
    if spec is not None:  # an embedding model: served for embeddings only
        from .hf.encoder_engine import EncoderEngine

        return EncoderEngine(model.path, spec, device=config.device, dtype=config.dtype,
                             num_threads=config.num_threads, local_files_only=model.local_files_only)
    from .hf.hf_engine import HFEngine

    return HFEngine(
        model.path,
        device=config.device,
        dtype=config.dtype,
        num_threads=config.num_threads,
        local_files_only=model.local_files_only,
        draft_local_files_only=draft.local_files_only if draft else True,
        generation_defaults=config.generation_defaults,
        split_reasoning=config.split_reasoning,
        tool_call_format=config.tool_call_format,
        prefix_cache_mb=config.prefix_cache_mb,
        prefix_cache_disk_mb=config.prefix_cache_disk_mb,
        prepack_weights=config.prepack_weights,
        quantize=config.quantize,
        draft_model=draft.path if draft else "",
    )


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {brief(str(err)) or type(err).__name__}"
