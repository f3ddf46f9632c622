"""GGUF files of the locally built Llama models, written with gguf-py (llama.cpp's own Python
package) the way llama.cpp's ``convert_hf_to_gguf.py`` writes a Llama: its tensor names, q/k
rows permuted for its RoPE, the byte-level BPE tokenizer as tokens and merges, the chat
template; linear weights in a block type gguf-py can quantize (q4_0, q4_1, q8_0, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py's ``LlamaModel.permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model_dir: Path, out: Path, linear_type: str = "F32") -> Path:
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    weights = load_file(str(model_dir / "model.safetensors"))
    layers, heads, kv_heads = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    hidden = config["hidden_size"]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(model_dir.name)
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 1e4)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(hidden // heads)
    vocab = tokenizer["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    tokens = [None] * (max([*vocab.values(), *added.values()]) + 1)
    for text, i in {**vocab, **added}.items():
        tokens[i] = text
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL for t in tokens])
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    eos = added["<|endoftext|>"]
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(eos)
    writer.add_chat_template((model_dir / "chat_template.jinja").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    qtype = gguf.GGMLQuantizationType[linear_type]
    for hf_name, tensor in weights.items():
        base, _, suffix = hf_name.rpartition(".")
        name = f"{names.get_name(base)}.{suffix}"
        data = tensor.to(torch.float32).numpy()
        if ".q_proj." in hf_name:
            data = _permute(data, heads)
        elif ".k_proj." in hf_name:
            data = _permute(data, kv_heads)
        linear = data.ndim == 2 and "embed_tokens" not in hf_name
        if linear and qtype not in (gguf.GGMLQuantizationType.F32,):
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
