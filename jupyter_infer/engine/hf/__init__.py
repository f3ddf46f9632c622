"""The Hugging Face runner: its rows, batches and buckets, the ragged and Llama forwards,
and speculation."""

from .hf_engine import HFEngine

__all__ = ["HFEngine"]
