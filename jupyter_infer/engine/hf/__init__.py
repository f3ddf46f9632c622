"""The Hugging Face runner: its rows, batches and buckets, the ragged and Llama forwards,
and the verification of draft tokens in its forward."""

from .hf_engine import HFEngine

__all__ = ["HFEngine"]
