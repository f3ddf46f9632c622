"""Checkpoints into modules: safetensors through transformers or streamed, GGUF files,
GPTQ/AWQ checkpoints, meta-device loading, and the choice of device and dtype."""
