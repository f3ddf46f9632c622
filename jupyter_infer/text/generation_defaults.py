"""What a checkpoint says about its answers besides its weights and tokenizer: its own
sampling defaults, what its ``generation_config.json`` says for ``temperature``, ``top_p``,
``top_k`` and ``repetition_penalty``.

The OpenAI routes use them where a request leaves a field out (vLLM's ``--generation-config
auto`` does the same): Qwen2.5-Instruct ships ``temperature 0.7, top_p 0.8, top_k 20,
repetition_penalty 1.05``, Llama 3.x ``temperature 0.6, top_p 0.9``, and a client that sends
none of them expects the model's own, not OpenAI's ``temperature 1``. ``do_sample: false``
means greedy, as ``generate`` reads it. Values outside what a request may send are left out.
"""

from __future__ import annotations

from typing import Any

# What a request may send for each (wire/fields.py checks the same ranges).
_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, 100_000), "repetition_penalty": (0.0, 10.0)}


def sampling_defaults(generation_config: Any) -> dict[str, float]:
    """The sampling fields ``generation_config`` sets, within the ranges a request may send."""
    if generation_config is None:
        return {}
    if getattr(generation_config, "do_sample", None) is False:
        return {"temperature": 0.0}
    out: dict[str, float] = {}
    for name, (lo, hi) in _RANGES.items():
        value = getattr(generation_config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi:
            out[name] = int(value) if name == "top_k" else float(value)
    return out
