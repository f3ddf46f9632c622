"""What serves requests here (``EngineInfo``): a local engine, an upstream server or a router,
its model, device and limits. A value every floor reads, so it lives below them all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class EngineInfo:
    engine: str  # "hf" | "simulated" | "openai" | "router"
    model: str
    device: str
    dtype: str
    max_context: int  # prompt + generated tokens one row can hold
    fallback_reason: str | None = None
    details: dict = field(default_factory=dict)
    # Every model served, as v1/models cards ({"id", "route"}): a router's, one per backend.
    # Empty: just ``model``.
    models: list[dict[str, Any]] = field(default_factory=list)
    # The checkpoint's sampling defaults (its generation config), for fields an OpenAI request
    # leaves out; empty: OpenAI's.
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    # Its chat answers may hold a <think> section, split out as reasoning_content.
    reasoning: bool = False
    # How its chat answers call tools: {"format": "hermes", "prompt": "chat template" | "built-in"}.
    tool_calls: dict[str, str] = field(default_factory=lambda: {"format": "hermes", "prompt": "built-in"})

    # Other names of the served model: the short id it was listed and loaded by (Ollama's name:tag).
    aliases: list[str] = field(default_factory=list)
    # The name people see (v1/models' id, answers' model, status): the listing's short id of a
    # model under InferApp.model_dirs; None: ``model`` itself.
    name: str | None = None

    @property
    def served_name(self) -> str:
        return self.name or self.model

    def model_names(self) -> list[str]:
        """The served model's name first, then the names a request may use for it (or, for
        a router, for any of its backends: their models and the backends' own names)."""
        names = [self.served_name, self.model, *self.aliases, Path(self.model).name, "default"]
        for card in self.models:
            names += [card["id"], Path(card["id"]).name, card.get("route")]
        return list(dict.fromkeys(n for n in names if n))
