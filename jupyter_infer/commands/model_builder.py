"""Build small causal language models locally, with random weights.

The inference server needs real Hugging Face checkpoints to exercise loading,
tokenization, chat formatting and generation, but tests and demos must not
depend on network access to the Hub.  This module fabricates such checkpoints
on disk: a byte-level BPE tokenizer trained on a built-in English corpus plus a
randomly initialised GPT-2 or Llama model.  The weights are untrained, so the
generated text is gibberish; only the shapes, file formats and token plumbing
are realistic.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from .embedding_builder import PAIR_TOKENS, as_pair_tokenizer, build_embedding_model, build_reranker

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "MARKER_FILE",
    "SIZES",
    "default_cache_dir",
    "ensure_model",
    "make_model",
]

# The public shapes of the models users run (their config.json's sizes; the vocabulary is our
# small trained tokenizer's, not theirs): the bench's ladder (issue 49). Built in bfloat16, as
# they ship, in the Llama architecture (Qwen2.5's q/k/v biases left out).
LADDER = {
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1_000_000.0),
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1_000_000.0),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1_000_000.0),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=500_000.0),
}
LADDER_CONTEXT = 32768  # room for the bench's ~8k-token prompts and more

SIZES = ("tiny", "small", "llama-tiny", "coder-tiny", "embed-tiny", "rerank-tiny", "0.5b", *LADDER)
# What each size is, as `make-model --help` says it (the shapes are _build_model's).
SIZE_HELP = {
    "tiny": "GPT-2, 2 layers of 128 (~0.7 M parameters, 512 positions): for tests, loads in a second",
    "small": "GPT-2, 12 layers of 768 (~90 M parameters, GPT-2 small's shape)",
    "llama-tiny": "Llama, 2 layers of 128, grouped-query attention: the Llama path (our CPU forward) in small",
    "embed-tiny": "BERT encoder, 2 layers of 128, mean pooling (sentence-transformers files): an embedding model",
    "rerank-tiny": "BERT cross-encoder (one-label head, [CLS] a [SEP] b [SEP] pairs): a reranker",
    "coder-tiny": "llama-tiny with Qwen2.5-Coder's fill-in-the-middle and file tokens: infill (suffix) in small",
    "0.5b": "Llama with Qwen2.5-0.5B's shape (24 layers of 896, ~0.36 B parameters): real-size timings",
    "1.5b": "Qwen2.5-1.5B's shape in bfloat16 (28 layers of 1536; ~1.3 B parameters with our small vocabulary)",
    "3b": "Qwen2.5-3B's shape in bfloat16 (36 layers of 2048; ~2.8 B parameters with our small vocabulary)",
    "7b": "Qwen2.5-7B's shape in bfloat16 (28 layers of 3584; ~6.5 B parameters, 13 GB; needs ~16 GB of memory to build)",
    "8b": "Llama-3.1-8B's shape in bfloat16 (32 layers of 4096; ~7 B parameters, 14 GB; needs ~16 GB to build)",
}

EOS_TOKEN = "<|endoftext|>"
# Role markers are special tokens so a chat prompt tokenizes into clean,
# unambiguous boundaries instead of fragments like "<", "|", "user".
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# A code model's infill markers (Qwen2.5-Coder's spelling: text/fim.py), in coder-tiny's vocabulary.
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>")

# Renders "<|role|>\ncontent\n" per message, then "<|assistant|>\n" when the
# caller asks for a generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

MARKER_FILE = "jupyter_infer_model.json"
# Bump when the build recipe changes so stale cached models get rebuilt.
BUILD_VERSION = 1

# Target BPE vocabulary per size.  The corpus is small, so training may stop
# earlier; the model's embedding matrix always matches the real tokenizer size
# so that every id the model can emit decodes to text.
_DEFAULT_VOCAB = {"tiny": 2000, "small": 8000, "llama-tiny": 2000, "coder-tiny": 2000, "embed-tiny": 2000, "rerank-tiny": 2000, "0.5b": 8000, **dict.fromkeys(LADDER, 8000)}

# Files whose presence (with the marker) means a build completed.
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

CORPUS = """\
A large language model is a neural network trained to predict the next token in a
sequence of text. Tokens are small pieces of text, such as words, parts of words,
punctuation marks, or single bytes. A tokenizer splits raw text into tokens and maps
each token to an integer id from a fixed vocabulary. Byte-level byte pair encoding
starts from the 256 possible bytes and repeatedly merges the most frequent pair.
Because every byte is in the base alphabet, a byte-level tokenizer can encode any
string without unknown tokens. The transformer architecture, introduced in 2017,
replaced recurrence with attention over the whole sequence. Self-attention lets
every position look at every earlier position and weigh how relevant each one is.
Each attention head computes queries, keys and values, then mixes the values using
softmax-normalized scores. Multi-head attention runs several heads in parallel so
the model can track different relationships at once. Grouped-query attention shares
each key and value head across several query heads to shrink the KV cache. Rotary
position embeddings, often called RoPE, encode position by rotating query and key
vectors. GPT-2 instead learns an absolute position embedding for each of its 1024
positions. A feed-forward block follows attention in every layer; Llama uses a gated
SwiGLU variant of it. Layer normalization, or RMSNorm in newer models, keeps
activations in a stable numeric range. Residual connections add each block's input
to its output, which makes deep networks easier to train. During pretraining, the
model reads billions of words and minimizes cross-entropy loss on the next token.
Gradient descent, usually with the Adam or AdamW optimizer, nudges the weights to
reduce that loss. The learning rate schedule often warms up linearly and then decays
with a cosine curve. Fine-tuning adapts a pretrained model to a narrower task, such
as answering questions or writing code. Instruction tuning teaches a model to follow
requests written in plain language. Reinforcement learning from human feedback, or
RLHF, ranks answers and rewards the ones people prefer. A chat template formats a
conversation of system, user and assistant messages into a single prompt. Inference
is the process of running a trained model to produce new text from a prompt. The
prefill phase processes the whole prompt at once; the decode phase then emits one
token per step. A key-value cache stores the keys and values of earlier tokens so
they are not recomputed at every step. Continuous batching lets a server add and
remove requests from a running batch between decode steps. Paged attention splits
the KV cache into fixed-size blocks, much like virtual memory pages in an operating
system. Greedy decoding always picks the most likely next token, which is fast and
deterministic but can repeat itself. Sampling with a temperature makes the
distribution sharper when below one and flatter when above one. Top-k sampling keeps
only the k most likely tokens; top-p, or nucleus, sampling keeps the smallest set
whose mass exceeds p. A repetition penalty lowers the score of tokens that have
already appeared in the output. Generation stops when the model emits an
end-of-sequence token or reaches the maximum number of new tokens. Streaming sends
each token to the client as soon as it is decoded, so users see text appear
immediately. Latency is measured as time to first token and as the time between
later tokens. Throughput counts how many tokens per second a server produces across
all concurrent requests. Quantization stores weights in 8-bit or 4-bit integers to
cut memory use and speed up inference. Mixed precision runs most operations in
float16 or bfloat16 while keeping sensitive values in float32. A GPU has thousands
of small cores and high memory bandwidth, which suits the matrix multiplications in
transformers. Memory bandwidth, not arithmetic, usually limits how fast a single
request can decode. Speculative decoding lets a small draft model propose several
tokens that the large model verifies in one pass. Embeddings map tokens to dense
vectors; similar meanings tend to end up close together in that space. Perplexity is
the exponential of the average loss and measures how surprised a model is by a text.
The context window is the maximum number of tokens a model can attend to at once,
for example 2048 or 8192. Retrieval-augmented generation fetches relevant documents
and places them in the prompt before answering. Hallucination describes confident
answers that are not supported by the facts. Evaluation uses benchmarks, held-out
test sets and careful human review to compare models. Safety work tries to make
models refuse harmful requests while remaining helpful for ordinary ones. Open
models publish their weights so researchers can study, fine-tune and deploy them on
their own hardware. A Jupyter notebook mixes code, output and prose, which makes it
a friendly place to experiment with models. Python libraries such as PyTorch,
Transformers and Tokenizers handle tensors, model code and text processing. Machine
learning, deep learning and artificial intelligence are related but not identical
ideas. Why does the model answer this way? What happens if we change the prompt, the
seed or the temperature? Researchers still debate how much these systems understand,
reason, plan and remember. Good prompts are clear, specific and give examples of the
desired format. The quick brown fox jumps over the lazy dog, and the five boxing
wizards jump quickly.
"""


def default_cache_dir() -> pathlib.Path:
    """Return where ``ensure_model`` keeps built models.

    ``$JUPYTER_INFER_HOME/models`` if that variable is set, otherwise
    ``~/.cache/jupyter_infer/models``.
    """
    home = os.environ.get("JUPYTER_INFER_HOME")
    if home:
        return pathlib.Path(home).expanduser() / "models"
    return pathlib.Path.home() / ".cache" / "jupyter_infer" / "models"


def ensure_model(size: str = "tiny") -> pathlib.Path:
    """Return the cached model of ``size``, building it on first use."""
    return make_model(default_cache_dir() / size, size=size)


def make_model(
    directory: str | os.PathLike,
    size: str = "tiny",
    seed: int = 0,
    vocab_size: int | None = None,
    context: int | None = None,
) -> pathlib.Path:
    """Build a random-weight causal LM and its tokenizer into ``directory``.

    Sizes:

    * ``"tiny"``: GPT-2, 2 layers, 4 heads, width 128, 512 positions,
      2000-token vocab; about 0.7M parameters.
    * ``"small"``: GPT-2 small shape (12 layers, 12 heads, width 768,
      1024 positions).  The BPE target is 8000 tokens but the built-in
      corpus only yields about 3.3k, so it has about 88M parameters instead
      of GPT-2's 124M (~350 MB of float32 weights; builds in a few seconds).
    * ``"llama-tiny"``: Llama with RoPE and grouped-query attention
      (width 128, 2 layers, 4 query heads, 2 key/value heads, MLP 256,
      512 positions, 2000-token vocab); about 0.8M parameters.
    * ``"0.5b"``: a real small model's shape, Qwen2.5-0.5B's dimensions in
      the Llama architecture (width 896, 24 layers, 14 query heads, 2
      key/value heads, MLP 4864, tied embeddings, 2048 positions) with the
      "small" tokenizer: about 0.36B parameters (1.45 GB of float32;
      builds in about a minute). What users run, for the bench's real-size rows.

    ``vocab_size`` overrides the BPE target; the model's vocabulary always
    equals the trained tokenizer's actual size, which may be smaller.
    ``context`` overrides the size's positions (e.g. 4096: room for tool schemas).

    If ``directory`` already holds a complete build with the same recipe,
    it is returned untouched, so repeated calls are cheap.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; expected one of {SIZES}")
    target = pathlib.Path(directory)
    marker = {
        "builder": "jupyter_infer",
        "build_version": BUILD_VERSION,
        "size": size,
        "seed": seed,
        "vocab_size": vocab_size if vocab_size is not None else _DEFAULT_VOCAB[size],
        # Only when asked: the builds made before the option keep matching their marker.
        **({"context": context} if context else {}),
    }
    if _is_complete(target, marker):
        return target

    target.mkdir(parents=True, exist_ok=True)
    # Drop any stale marker first: if this build dies halfway, the directory
    # must not look complete.
    (target / MARKER_FILE).unlink(missing_ok=True)

    # Build in a sibling staging dir and move files in afterwards, so a reader
    # never sees a half-written safetensors file under the final name.
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        specials = {"coder-tiny": FIM_TOKENS, "rerank-tiny": PAIR_TOKENS}.get(size, ())
        tokenizer = _train_tokenizer(marker["vocab_size"], _max_positions(size, context), specials=specials)
        if size == "rerank-tiny":
            tokenizer = as_pair_tokenizer(tokenizer)
            model = build_reranker(staging, tokenizer, seed, _max_positions(size, context))
        elif size == "embed-tiny":
            model = build_embedding_model(staging, tokenizer, seed, _max_positions(size, context))
        else:
            model = _build_model(size, tokenizer, seed, context)
            model.save_pretrained(staging, max_shard_size="64GB")  # one model.safetensors, whatever the size
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(_readme(size, seed, model, tokenizer))
        for path in staging.iterdir():
            os.replace(path, target / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    # The marker is written last; its presence means the build finished.
    marker["num_parameters"] = model.num_parameters()
    marker["tokenizer_vocab_size"] = len(tokenizer)
    (target / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    return target


def _is_complete(target: pathlib.Path, wanted: dict[str, object]) -> bool:
    """Whether ``target`` holds a finished build matching ``wanted``."""
    try:
        found = json.loads((target / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(found, dict) or any(found.get(k) != v for k, v in wanted.items()):
        return False
    # An encoder has no generation config.
    encoder = found.get("size") in ("embed-tiny", "rerank-tiny")
    needed = [n for n in _REQUIRED_FILES if not encoder or n != "generation_config.json"]
    return all((target / name).is_file() for name in needed)


def _train_tokenizer(vocab_size: int, max_length: int, lines: list[str] | None = None,
                     specials: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the built-in corpus (or on ``lines``)."""
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False keeps decode(encode(s)) == s exact.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[EOS_TOKEN, *ROLE_TOKENS, *specials],
        # Seed with all 256 bytes so text outside the corpus (other scripts,
        # emoji) still encodes losslessly.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines if lines is not None else _training_lines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[*ROLE_TOKENS, *specials],
        chat_template=CHAT_TEMPLATE,
        # Cleanup would rewrite " ." as "." and break exact round trips.
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )


def _training_lines() -> list[str]:
    """The corpus, repeated in lower, UPPER and Title case.

    Verbatim repetition would not change BPE merges (only relative pair counts
    matter), and a few KB of text runs out of merges at ~1.5k tokens.  Case
    variants add distinct words, lifting the reachable vocabulary to ~3.3k
    while keeping the merges biased towards the original, natural text.
    """
    lines = CORPUS.splitlines(keepends=True)
    return [
        *lines,
        *(line.lower() for line in lines),
        *(line.upper() for line in lines),
        *(line.title() for line in lines),
    ]


def _max_positions(size: str, context: int | None = None) -> int:
    """Context length (positions) of the model built for ``size`` (``context`` if given)."""
    return context or {"small": 1024, "0.5b": 2048, **dict.fromkeys(LADDER, LADDER_CONTEXT)}.get(size, 512)


def _build_model(size: str, tokenizer: PreTrainedTokenizerFast, seed: int,
                 context: int | None = None) -> PreTrainedModel:
    """Instantiate a randomly initialised model sized for ``tokenizer``."""
    ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if size in ("llama-tiny", "coder-tiny", "0.5b", *LADDER):
        shape = LADDER.get(size) or dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=256)
        if size == "0.5b":  # Qwen2.5-0.5B's (float32, as the bench has always measured it)
            shape = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         rope_theta=1_000_000.0)
        config: GPT2Config | LlamaConfig = LlamaConfig(
            **shape,
            max_position_embeddings=_max_positions(size, context),
            **ids,
        )
        model_cls: type[PreTrainedModel] = LlamaForCausalLM
    else:
        shape = (2, 4, 128) if size == "tiny" else (12, 12, 768)
        config = GPT2Config(
            n_layer=shape[0],
            n_head=shape[1],
            n_embd=shape[2],
            n_positions=_max_positions(size, context),
            **ids,
        )
        model_cls = GPT2LMHeadModel
    # The ladder's sizes are built in bfloat16 straight away: a 7B shape in float32 is 30 GB.
    dtype = torch.bfloat16 if size in LADDER else torch.float32
    # fork_rng restores the caller's global RNG state afterwards, so building
    # a model has no side effect on the notebook's own randomness.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls._from_config(config, dtype=dtype)  # transformers' own: built in that dtype
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos_token_id"],
        eos_token_id=ids["eos_token_id"],
        pad_token_id=ids["pad_token_id"],
    )
    return model


def _readme(
    size: str, seed: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> str:
    """Model card that makes it obvious these weights are meaningless."""
    return (
        f"# jupyter_infer random model: {size}\n\n"
        "Built locally by `jupyter_infer.commands.model_builder.make_model`.\n\n"
        "The weights are **random** (untrained); generated text is gibberish.\n"
        "This checkpoint exists to test loading, tokenization, chat templates\n"
        "and generation without downloading anything.\n\n"
        f"- architecture: {type(model).__name__}\n"
        f"- parameters: {model.num_parameters():,}\n"
        f"- tokenizer: byte-level BPE, {len(tokenizer)} tokens, trained on a\n"
        "  built-in English corpus about AI and language models\n"
        f"- seed: {seed}\n"
    )
