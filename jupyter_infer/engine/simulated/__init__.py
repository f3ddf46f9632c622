"""The offline engine: deterministic answers about AI concepts at a realistic token rate."""

from .simulated_engine import SimulatedEngine

__all__ = ["SimulatedEngine"]
