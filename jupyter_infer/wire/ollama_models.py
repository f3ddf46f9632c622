"""Ollama's model routes (``api/tags``, ``api/show``, ``api/ps``, ``api/version``) as this
server's models: what the catalog lists (``formats/model_catalog``, through the model shelf)
and what the loaded model's ``EngineInfo`` says, in Ollama's shapes.

The handler gathers the facts (``ModelFacts``: the listing's entry, its file's time, what its
``config.json`` says); these functions only shape them. What is not known without loading a
model (its family, size in parameters, capabilities beyond completion and tools) is said only
for the loaded one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..values.engine_info import EngineInfo

# The Ollama release whose API these routes follow (clients compare versions to enable
# features: tools, structured outputs, think).
API_VERSION = "0.12.0"
NEVER = "2318-01-01T00:00:00Z"  # expires_at of a model never unloaded for idling (Ollama's keep_alive -1)
_PARAMETERS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
               "repetition_penalty": "repeat_penalty"}


@dataclass
class ModelFacts:
    """One model as the handler found it: listed (``name``, ``path``, ``source``, ``size``),
    when its file changed, what its ``config.json`` says, and ``info`` if it is loaded."""

    name: str
    path: str
    source: str  # the catalog's: huggingface, folder, gguf, ollama; or simulated, configured, loaded
    size: int = 0
    modified: float | None = None  # seconds since the epoch
    family: str = ""  # config.json's model_type
    context_length: int | None = None
    info: EngineInfo | None = None  # the loaded model's


def _time(seconds: float | None) -> str:
    moment = datetime.fromtimestamp(seconds, timezone.utc) if seconds is not None else datetime.now(timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def family_of(architecture: str) -> str:
    """``LlamaForCausalLM`` → ``llama``, ``GPT2LMHeadModel`` → ``gpt2``."""
    for tail in ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "Model"):
        if architecture.endswith(tail) and architecture != tail:
            return architecture.removesuffix(tail).lower()
    return architecture.lower()


def parameter_size(count: Any) -> str:
    """Ollama's way of writing a size: ``494.03M``, ``7.6B``."""
    if not isinstance(count, int) or count <= 0:
        return ""
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"


def digest(facts: ModelFacts) -> str:
    """Ollama's blob digest for a model from its store; else a stable id of its path."""
    if facts.source == "ollama":
        return facts.path.rsplit("/", 1)[-1].removeprefix("sha256-")
    return hashlib.sha256(facts.path.encode()).hexdigest()


def _family(facts: ModelFacts) -> str:
    """The family: config.json's ``model_type``, else the loaded model's architecture's, else
    ``unknown``. The same in ``details`` and in ``model_info``'s ``<family>.context_length``
    (clients look the context up by the family api/tags gave: Notebook Intelligence does)."""
    if not facts.family and facts.info is not None and facts.info.details.get("architecture"):
        return family_of(str(facts.info.details["architecture"]))
    return facts.family or "unknown"


def details(facts: ModelFacts) -> dict[str, Any]:
    """``details``: the weights' format, family, size and quantization (as far as known)."""
    info = facts.info
    fmt = "gguf" if facts.source in ("gguf", "ollama") or facts.path.endswith(".gguf") else "safetensors"
    quantization = ""
    if info is not None:
        quantize = str(info.details.get("quantize", "none"))
        quantization = (info.dtype if quantize == "none" else quantize).upper().replace("FLOAT", "F")
    family = _family(facts)
    return {"parent_model": "", "format": fmt, "family": family, "families": [family],
            "parameter_size": parameter_size(info.details.get("parameters") if info else None),
            "quantization_level": quantization}


def tag(facts: ModelFacts) -> dict[str, Any]:
    """One ``api/tags`` entry."""
    return {"name": facts.name, "model": facts.name, "modified_at": _time(facts.modified), "size": facts.size,
            "digest": digest(facts), "details": details(facts)}


def running(facts: ModelFacts, unload_after_s: float) -> dict[str, Any]:
    """The loaded model as an ``api/ps`` entry: ``expires_at`` is when the idle unload
    (``InferApp.unload_after_s``) would come at the latest, if it is on."""
    info = facts.info
    assert info is not None
    expires = NEVER if unload_after_s <= 0 else _time(
        (datetime.now(timezone.utc) + timedelta(seconds=unload_after_s)).timestamp())
    on_gpu = info.device.startswith(("cuda", "mps", "xpu"))
    return {**tag(facts), "expires_at": expires, "size_vram": facts.size if on_gpu else 0,
            "context_length": info.max_context}


def capabilities(facts: ModelFacts) -> list[str]:
    """What the model can be asked for here: every model completes and calls tools (their
    grammar works with any model); ``thinking`` and ``insert`` (fill-in-the-middle tokens)
    are known once it is loaded."""
    out = ["completion", "tools"]
    if facts.info is not None and facts.info.reasoning:
        out.append("thinking")
    if facts.info is not None and facts.info.details.get("fim"):
        out.append("insert")
    return out


def _parameters(info: EngineInfo | None) -> str:
    """The checkpoint's sampling defaults, as a Modelfile's ``PARAMETER`` lines would say them."""
    if info is None:
        return ""
    return "\n".join(f"{_PARAMETERS.get(k, k):<30} {v:g}" for k, v in sorted(info.sampling_defaults.items()))


def show(facts: ModelFacts) -> dict[str, Any]:
    """``api/show``: details, ``model_info`` (architecture, context length, parameter count),
    capabilities, the sampling defaults. There is no Modelfile nor Go template here: the
    model's own chat template (Jinja) is applied by the server, so ``template`` is empty."""
    info = facts.info
    family = _family(facts)
    model_info: dict[str, Any] = {"general.architecture": family, "general.basename": facts.name}
    if info is not None and isinstance(info.details.get("parameters"), int):
        model_info["general.parameter_count"] = info.details["parameters"]
    context = info.max_context if info is not None else facts.context_length
    if context:
        model_info[f"{family}.context_length"] = context
    return {"license": "", "modelfile": f"# served by jupyter_infer: no Modelfile\nFROM {facts.path}\n",
            "parameters": _parameters(info), "template": "", "details": details(facts), "model_info": model_info,
            "capabilities": capabilities(facts), "modified_at": _time(facts.modified)}


def version() -> dict[str, str]:
    return {"version": API_VERSION}
