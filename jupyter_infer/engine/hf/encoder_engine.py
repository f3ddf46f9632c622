"""An embedding model served on its own (a BERT-style encoder, or a decoder embedder such as
Qwen3-Embedding), or a reranker (a cross-encoder: a query and a document read together, one
score): every request an embedding (a pair's: its score), run in the engine's steps as the causal engine's
are (``Engine.embed``), pooled as its sentence-transformers config says. It writes no answers:
the loop refuses those before the queue (``engine_loop.check_task``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...formats.device_choice import default_num_threads, pick_device, pick_dtype
from ...formats.embedding_checkpoint import EmbeddingSpec
from ...formats.hf_load import parameter_count
from ...text.hf_text import HFText, load_tokenizer
from ...values import load_progress
from ...values.engine_info import EngineInfo
from ..base import Engine, RowRequest, Sampled
from . import pooling
from .encoder_forward import PackedEncoder, pooled


def prepack_linears(model: torch.nn.Module) -> str:
    """Swap ``model``'s linears for oneDNN's prepacked ones (bias fused) where oneDNN takes its
    dtype; what they run on now. An encoder's every forward is many rows (a batch of texts'
    tokens), where oneDNN's packed GEMM beats aten's addmm (which copies the bias into the
    output first) and our row kernels (made for a decode step's few rows): a batch of 64 short
    texts on a bge-small shape ran ~1.45x faster in float32, ~1.3x in bfloat16 (2 threads)."""
    from ...cpu.model_linears import PackedLinear, onednn_available, onednn_refuses

    dtype = next(model.parameters()).dtype
    if not onednn_available() or dtype not in (torch.float32, torch.bfloat16) or onednn_refuses(dtype):
        return "eager (aten addmm)"
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PackedLinear(child.weight.detach(), None if child.bias is None
                                                       else child.bias.detach()))
    return f"onednn prepacked {str(dtype).removeprefix('torch.')}"


def encoder_dtype(dtype: str, device: str) -> torch.dtype:
    """``pick_dtype``'s choice, except that ``auto`` on a CPU without AMX is float32: an
    encoder's forward is large GEMMs, not a decode step's weight reads, and AVX512-BF16's
    bfloat16 GEMM (oneDNN, with its conversions around the small ops) was ~1.2x slower than
    float32 on a batch of 64 texts (bge-small shape, 2 threads, docs/benchmark.md [k])."""
    from ...cpu.features import cpu_flags

    if dtype == "auto" and device == "cpu" and "amx_bf16" not in cpu_flags():
        return torch.float32
    return pick_dtype(dtype, device)


class EncoderEngine(Engine):
    generates = False
    embeds = True

    def __init__(self, model: str, spec: EmbeddingSpec, *, device: str = "auto", dtype: str = "auto",
                 num_threads: int = 0, local_files_only: bool = True) -> None:
        super().__init__()
        from transformers import AutoModel, AutoModelForSequenceClassification

        self.device = pick_device(device)
        torch_dtype = encoder_dtype(dtype, self.device)
        if self.device == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
        load_progress.current().phase("reading the tokenizer")
        tokenizer = load_tokenizer(model, local_files_only)
        # An encoder reads its own markers ([CLS] ... [SEP]): its vectors were trained so.
        self.text = HFText(tokenizer, special_tokens=spec.pooling != "last")
        load_progress.current().phase("loading the weights (transformers)")
        kind = AutoModelForSequenceClassification if spec.pooling == "score" else AutoModel
        self.model = kind.from_pretrained(model, dtype=torch_dtype, local_files_only=local_files_only)
        self.sep_token_id = tokenizer.sep_token_id
        self.model.to(self.device).eval()
        parameters = parameter_count(self.model)
        # BERT's family on the CPU: our packed forward (no padding in the linears); else
        # transformers' forward, its linears prepacked.
        self.packed = PackedEncoder.of(self.model.base_model)
        if self.packed is not None:
            self.linear_kernels = "onednn prepacked float32, packed tokens (encoder_forward)"
        else:
            self.linear_kernels = prepack_linears(self.model) if self.device == "cpu" else "eager"
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else 0
        self.spec = spec
        config = self.model.config
        self.info = EngineInfo(
            engine="hf", model=model, device=self.device, dtype=str(torch_dtype).removeprefix("torch."),
            max_context=int(getattr(config, "max_position_embeddings", None) or 512),
            details={"architecture": spec.architecture or type(self.model).__name__,
                     "task": "rerank" if spec.pooling == "score" else "embedding",
                     "pooling": spec.pooling, "embedding_size": int(config.hidden_size),
                     "parameters": parameters, "num_threads": torch.get_num_threads(),
                     "linear_kernels": self.linear_kernels},
        )

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def embed(self, rows: list[RowRequest]) -> list[list[float]]:
        if self.packed is not None:
            return self._packed_embed([r.prompt_ids for r in rows])
        if self.spec.pooling == "score":  # a cross-encoder: each row a pair, its score
            return pooling.scores(self.model, [r.prompt_ids for r in rows], self.pad_token_id, self.device,
                                  self.sep_token_id)
        return pooling.embeddings(self.model, [r.prompt_ids for r in rows], self.pad_token_id, self.device,
                                  self.spec.pooling)

    def _packed_embed(self, prompts: list[list[int]]) -> list[list[float]]:
        """Every row in one packed forward (``encoder_forward``): pooled and normalized, or a
        cross-encoder's pairs through its head, one logit each."""
        lengths = [len(p) for p in prompts]
        with torch.inference_mode():
            if self.spec.pooling != "score":
                hidden = self.packed.hidden(prompts)
                return F.normalize(pooled(hidden, lengths, self.spec.pooling), dim=-1).tolist()
            types = [pooling.pair_types(torch.tensor([p]), self.sep_token_id)[0].tolist() for p in prompts] \
                if getattr(self.model.config, "type_vocab_size", 1) > 1 else None
            first = pooled(self.packed.hidden(prompts, types), lengths, "cls")
            model = self.model
            if model.config.model_type == "bert":  # its pooler (dense, tanh) on [CLS], then the head
                logits = model.classifier(model.bert.pooler.activation(model.bert.pooler.dense(first)))
            else:  # RoBERTa's head reads the first column itself
                logits = model.classifier(first[:, None])
        return [[float(x)] for x in logits[:, 0]]

    def prefill(self, seqs: list[RowRequest], num_scheduled: list[int]) -> Sampled:
        raise RuntimeError("an embedding model writes no tokens")  # check_task refuses such requests

    def decode(self, seqs: list[RowRequest], guesses: dict[str, int] | None = None) -> Sampled:
        raise RuntimeError("an embedding model writes no tokens")
