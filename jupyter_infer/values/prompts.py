"""Sample prompts about AI for the edges that need some: panel, magics, loadgen, demo, bench."""

from __future__ import annotations

SAMPLE_PROMPTS: list[str] = [
    "What is dynamic batching and how does it interact with the KV cache?",
    "Explain self-attention like I'm a new ML engineer.",
    "Why do transformers need positional information?",
    "How does retrieval-augmented generation reduce hallucinations?",
    "Compare LoRA with full fine-tuning for a 7B model.",
    "What are embeddings, and how are they stored in a vector database?",
    "How does quantization to 4-bit affect accuracy and GPU memory?",
    "What temperature should I use for code generation?",
    "Why is time to first token so much higher for long prompts?",
    "How does speculative decoding speed up inference?",
    "Explain mixture of experts models such as Mixtral.",
    "What happens when a conversation exceeds the context window?",
    "How do AI agents decide which tool to call?",
    "What is RLHF and why do chat models use it?",
    "How do diffusion models generate images from pure noise?",
    "Give me some prompt engineering tips for getting reliable JSON output.",
    "Why does the tokenizer split rare words into several tokens?",
    "Can I run a language model on a CPU, or do I really need a GPU?",
    "What is the trade-off between latency and throughput when serving LLMs?",
    "How should I manage GPU memory when loading models in a Jupyter notebook?",
    "What is knowledge distillation and when is it worth doing?",
    "Why stream tokens to the client instead of returning the whole response?",
    "How does pretraining differ from fine-tuning?",
    "Explain gradient descent and backpropagation in simple terms.",
    "Tell me something interesting about large language models.",
]
"""Realistic user prompts for "fill with N samples" and load generators."""
