"""Hugging Face causal LMs with iteration-level batching over a plain ``DynamicCache``.

The running batch is a value with two operations, as in TGI's ``CausalLMBatch``:
``concatenate`` (prefilled newcomers join: both KV caches are left-padded to one length and
concatenated on the batch axis) and ``filter`` (finished or cancelled rows leave, and cache
columns that only padding uses are trimmed). Per-row sampling state (each row's
``RowSampler``: parameters, RNG, logits processors) lives in the batch beside the tensors.
A long prompt prefilled in chunks is a one-row batch of its own until its last chunk, when it
joins the decoding rows. Every row keeps its own attention mask and
explicit ``position_ids``, so left padding never shifts a row's positions: that is what keeps
GPT-2's learned positions and Llama's RoPE exact.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from ..constraints.grammar import GrammarCompiler, masks_beside
from ..errors import InvalidRequest
from . import kv_cache
from .base import Engine, EngineInfo, KVUsage, Rows, Sampled
from .buckets import Buckets
from .cpu_linear import QUANTIZE, LinearReport, cpu_flags, int8_available, swap_linears
from .hf_batch import HFBatch, left_pad_rows
from .prefix_cache import PrefixCache
from .sampling import RowSampler, grammar_rows, prompt_logprobs, sample

if TYPE_CHECKING:
    from ..sequence import Sequence

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str = "auto") -> str:
    """CUDA, then Apple's MPS, then the CPU."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
        return DTYPES[dtype]
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    # On a CPU, bfloat16 halves the weight bytes a decode step reads, and CPUs with native
    # bf16 instructions turn that into ~2x tokens/s (docs/benchmark.md); without them it is
    # emulated and slower than float32.
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX (Linux's /proc/cpuinfo flags)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def check_quantize(quantize: str, device: str) -> None:
    """Refuse a weight format this machine has no fast kernel for, saying why."""
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    if device != "cpu":
        raise ValueError(f"quantize={quantize!r} is a CPU weight format; on {device} load the model in "
                         "bfloat16/float16 (dtype) instead.")
    if not int8_available():
        raise ValueError(f"quantize={quantize!r} needs PyTorch's x86 quantized kernels (fbgemm), which this "
                         "build or CPU lacks.")


def default_num_threads() -> int:
    """All cores on a small machine; leave two for kernels and the server on a big one."""
    cores = os.cpu_count() or 1
    return cores if cores <= 4 else cores - 2


class HFEngine(Engine):
    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        num_threads: int = 0,
        local_files_only: bool = False,
        prefix_cache_mb: float = 0,
        prepack_weights: bool = True,
        quantize: str = "none",
    ) -> None:
        hf_logging.disable_progress_bar()  # a server log is no place for tqdm bars
        self.device = pick_device(device)
        torch_dtype = pick_dtype(dtype, self.device)
        if quantize != "none":
            check_quantize(quantize, self.device)
            if dtype == "auto":
                torch_dtype = torch.float32  # what the int8 kernel takes and gives
        if self.device == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
        self.tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=local_files_only)
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch_dtype, local_files_only=local_files_only
        ).to(self.device)
        self.model.eval()
        parameters = sum(p.numel() for p in self.model.parameters())
        # What one forward reads of the weights (int8 keeps a quarter of float32's): the cost
        # of one more length bucket's decode step (buckets.py).
        weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.weight_bytes = weight_bytes // 4 if quantize != "none" else weight_bytes
        linears = LinearReport(kernels="eager (aten addmm)", layers=0, seconds=0.0)
        if self.device == "cpu":
            linears = swap_linears(self.model, prepack=prepack_weights, quantize=quantize)
        config = self.model.config
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0)
        self.max_token_chars = longest_token_chars(self.tokenizer)
        self.logits_width = int(config.vocab_size)  # what a grammar's mask covers
        self.grammars = _grammars(self.tokenizer, self.logits_width, self.eos_token_ids)
        # Rows can continue from stored KV (chunked prefill, prefix caching) when every layer
        # attends to the whole past; sliding-window layers would need their window kept.
        self._reusable = kv_cache.reusable(config)
        # On a CPU, 64-token chunks keep a running stream's worst stall near 0.15x of an
        # 800-token prefill for 1.5x its TTFT (docs/engine.md); a GPU prefills so fast that
        # small chunks would only add steps.
        self.prefill_chunk_tokens = (64 if self.device == "cpu" else 512) if self._reusable else 0
        self.configure_prefix_cache(prefix_cache_mb)
        self.kv_bytes_per_token = kv_cache.bytes_per_token(config, torch_dtype)
        max_context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048)
        self.info = EngineInfo(
            engine="hf",
            model=model,
            device=self.device,
            dtype=str(torch_dtype).removeprefix("torch."),
            max_context=int(max_context),
            details={
                "architecture": (config.architectures or [type(self.model).__name__])[0],
                "parameters": parameters,
                "num_threads": torch.get_num_threads(),
                "linear_kernels": linears.kernels,
                "quantize": quantize,
                "prepack_s": round(linears.seconds, 3),
                "chat_template": bool(getattr(self.tokenizer, "chat_template", None)),
            },
        )

    # -- text -------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def detokenize(self, token_ids: Seq[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            except TemplateError as err:  # e.g. "Conversation roles must alternate user/assistant"
                raise InvalidRequest(f"The model's chat template refused these messages: {err}",
                                     param="messages") from None
        return super().render_chat(messages)

    # -- steps ------------------------------------------------------------------------------
    def prefill(
        self, seqs: list[Sequence], num_scheduled: list[int], partial: dict[str, HFBatch],
    ) -> tuple[Sampled, HFBatch | None, dict[str, HFBatch]]:
        """Whole prompts in one left-padded forward; a long prompt (scheduled alone) one
        chunk at a time, continuing its row in ``partial``."""
        seq = seqs[0]
        if len(seqs) == 1 and (seq.id in partial or num_scheduled[0] < seq.num_uncomputed):
            sampled, row = self._prefill_chunk(seq, partial.get(seq.id), num_scheduled[0])
            rest = {i: r for i, r in partial.items() if i != seq.id}
            if sampled.tokens[0]:
                return sampled, self._buckets(row), rest
            return sampled, None, {**rest, seq.id: row}
        sampled, batch = self._prefill_whole(seqs)
        return sampled, self._buckets(batch), partial

    def _buckets(self, batch: HFBatch) -> Buckets:
        """Newly complete rows, as the decoding rows hold them: a group of very different
        lengths is split already (``concatenate`` regroups them with the rows running)."""
        buckets = Buckets([batch], self.weight_bytes, self.kv_bytes_per_token)
        buckets.rebalance()
        return buckets

    @torch.inference_mode()
    def _prefill_whole(self, seqs: list[Sequence]) -> tuple[Sampled, HFBatch]:
        """The newcomers' prompts in one left-padded forward. A row whose prompt starts with
        a cached prefix starts from that KV: its row reads ``[pad | cached | pad | rest]``,
        the mask hides both pads and ``position_ids`` continue from the cached length."""
        echo = [i for i, s in enumerate(seqs) if s.params.prompt_logprobs is not None]
        matches = [self._cached_prefix(s) for s in seqs]
        cached = [n for n, _ in matches]
        input_ids, new_mask = left_pad_rows([s.prompt_ids[n:] for s, n in zip(seqs, cached, strict=True)],
                                            self.pad_token_id)
        width = max(cached)
        past_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, n in enumerate(cached):
            past_mask[row, width - n :] = 1
        mask = torch.cat([past_mask, new_mask], dim=1)
        position_ids = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(cached)[:, None]
        input_ids, mask, position_ids = (t.to(self.device) for t in (input_ids, mask, position_ids))
        config = self.model.config
        cache = kv_cache.with_past(config, [kv for _, kv in matches], width) if width else kv_cache.new_cache(config)
        samplers = [self._sampler(s) for s in seqs]
        masks = masks_beside(grammar_rows(samplers), self.logits_width)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            # Logits of every position only when a row asks for its prompt's logprobs.
            logits_to_keep=0 if echo else 1,
        )
        if self.prefix_cache is not None:
            total = mask.shape[1]
            for row, (seq, n) in enumerate(zip(seqs, cached, strict=True)):
                rest = len(seq.prompt_ids) - n
                # Token j sits in column width - n + j (cached part) or total - rest + j - n.
                self.prefix_cache.insert(seq.prompt_ids, len(seq.prompt_ids), lambda a, b, row=row, n=n, rest=rest: (
                    kv_cache.row_kv(out.cache, row, width - n + a, width - n + b) if b <= n
                    else kv_cache.row_kv(out.cache, row, total - rest + a - n, total - rest + b - n)))
        if masks is not None:
            masks.result()
        sampled = sample(out.logits[:, -1, :], samplers)
        if echo:
            sampled.prompt_logprobs = [None] * len(seqs)
            for i in echo:
                prompt = seqs[i].prompt_ids
                sampled.prompt_logprobs[i] = prompt_logprobs(
                    out.logits[i, -len(prompt):], prompt, seqs[i].params.prompt_logprobs
                )
        return sampled, HFBatch(
            ids=[s.id for s in seqs],
            cache=out.cache,
            mask=mask,
            positions=torch.tensor([len(s.prompt_ids) for s in seqs], device=self.device),
            last=torch.tensor([t[-1] for t in sampled.tokens], dtype=torch.long, device=self.device),
            samplers=samplers,
            forced={s.id: t for s, t in zip(seqs, sampled.tokens, strict=True) if len(t) > 1},
        )

    @torch.inference_mode()
    def _prefill_chunk(self, seq: Sequence, partial: HFBatch | None, budget: int) -> tuple[Sampled, HFBatch]:
        """Up to ``budget`` more prompt tokens of ``seq``, continuing ``partial`` (the row so
        far; ``None``: start, from the longest cached prefix). One row, no padding: the mask
        is all ones and positions continue from the tokens already there. The row's first
        token comes with the prompt's last chunk."""
        prompt = seq.prompt_ids
        samplers = partial.samplers if partial is not None else [self._sampler(seq)]
        if partial is None:
            done, kv = self._cached_prefix(seq)
            cache = kv_cache.with_past(self.model.config, [kv], done) if done else kv_cache.new_cache(self.model.config)
            for layer in cache.layers:  # room for the whole prompt at once, not a copy per chunk
                layer.reserve = len(prompt) + kv_cache.SPARE_COLUMNS
        else:
            done, cache = partial.mask.shape[1], partial.cache
        end = min(len(prompt), done + budget)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        out = self.model(
            input_ids=torch.tensor([prompt[done:end]], dtype=torch.long, device=self.device),
            attention_mask=mask,
            position_ids=torch.arange(done, end, device=self.device)[None],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        if self.prefix_cache is not None:  # blocks complete so far: a prompt arriving now reuses them
            self.prefix_cache.insert(prompt, end, lambda a, b: kv_cache.row_kv(out.cache, 0, a, b))
        complete = end == len(prompt)
        sampled = sample(out.logits[:, -1, :], samplers) if complete else Sampled([[]], computed=[end])
        return sampled, HFBatch(
            ids=[seq.id], cache=out.cache, mask=mask,
            positions=torch.tensor([end], device=self.device),
            # No token to feed yet while the prompt is incomplete: its row is not decoded.
            last=torch.tensor([sampled.tokens[0][-1] if complete else 0], dtype=torch.long, device=self.device),
            samplers=samplers,
            forced={seq.id: sampled.tokens[0]} if len(sampled.tokens[0]) > 1 else {},
        )

    def _cached_prefix(self, seq: Sequence) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``seq``'s prompt (0 and ``None`` without a cache, or
        for a row that wants its prompt's logprobs: those need every prompt position's logits)."""
        if self.prefix_cache is None or seq.params.prompt_logprobs is not None:
            return 0, None
        return self.prefix_cache.match(seq.prompt_ids)

    def configure_prefix_cache(self, megabytes: float) -> None:
        """A fresh, empty prefix cache of ``megabytes`` (0: none)."""
        self.prefix_cache = None
        if megabytes > 0 and self._reusable:
            self.prefix_cache = PrefixCache(int(megabytes * 2**20))

    def kv_usage(self, rows: Rows | None) -> KVUsage:
        batches = [] if rows is None else [*(rows.decoding or ()), *rows.prefilling.values()]
        return KVUsage(
            bytes_held=sum(kv_cache.bytes_held(b.cache) for b in batches),
            tokens_held=sum(int(b.mask.sum()) for b in batches),
            bytes_per_token=self.kv_bytes_per_token,
        )

    def prefix_cache_stats(self) -> dict[str, Any] | None:
        if self.prefix_cache is None:
            return {"enabled": False, "reason": "off (prefix_cache_mb = 0)" if self._reusable
                    else "this model's cache has sliding-window layers"}
        return self.prefix_cache.stats()

    @torch.inference_mode()
    def decode(self, batch: Buckets, seqs: list[Sequence]) -> Sampled:
        """One forward per length bucket; every row's output in the plan's order. A row whose
        grammar forced tokens last step feeds them all (its bucket's other rows get as many
        pad columns)."""
        parts = [self._decode_bucket(bucket) for bucket in batch]
        if len(parts) == 1 and batch.ids == [s.id for s in seqs]:
            return parts[0]
        rows = {row_id: (part, row) for bucket, part in zip(batch, parts, strict=True)
                for row, row_id in enumerate(bucket.ids)}
        order = [rows[s.id] for s in seqs]

        def per_row(name: str) -> list | None:  # an optional per-row field, in the plan's order
            if not any(getattr(part, name) for part in parts):
                return None
            return [getattr(part, name)[row] if getattr(part, name) else None for part, row in order]

        forced = per_row("forced")
        return Sampled([part.tokens[row] for part, row in order], per_row("logprobs"), errors=per_row("errors"),
                       forced=None if forced is None else [n or 0 for n in forced])

    @torch.inference_mode()
    def _decode_bucket(self, batch: HFBatch) -> Sampled:
        """The next tokens of each row of ``batch`` (one, or more where a grammar forces
        them): it feeds each row's last token, or where a row's grammar forced more
        (``batch.forced``) every row's uncomputed tokens, left-padded."""
        masks = masks_beside(grammar_rows(batch.samplers), self.logits_width)
        feeds = batch.feeds()
        if feeds is None:
            input_ids, block, position_ids = batch.last[:, None], None, batch.positions[:, None]
        else:
            input_ids, block = (t.to(self.device) for t in left_pad_rows(feeds, self.pad_token_id))
            position_ids = batch.positions[:, None] + (block.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=batch.extend_mask(block),
            position_ids=position_ids,
            cache=batch.cache,
            use_cache=True,
            logits_to_keep=1,  # a forced run needs its last position's only
        )
        if masks is not None:
            masks.result()
        sampled = sample(out.logits[:, -1, :], batch.samplers)
        batch.cache = out.cache
        batch.positions = batch.positions + (1 if block is None else block.sum(-1))
        batch.took(sampled.tokens)
        return sampled

    def _sampler(self, seq: Sequence) -> RowSampler:
        return RowSampler.build(seq.params, seq.prompt_ids, self.eos_token_ids, self.device, seq.grammar)


def _grammars(tokenizer: Any, vocab: int, eos_ids: frozenset[int]) -> GrammarCompiler | None:
    """The grammar compiler for this tokenizer; ``None`` (structured outputs refused with a
    400 that says why, the model still served) where the library cannot read it (a slow,
    Python-only tokenizer)."""
    try:
        return GrammarCompiler.for_hf(tokenizer, vocab, eos_ids)
    except Exception as err:
        log.warning("jupyter_infer: structured outputs are off for this model: its tokenizer cannot be "
                    "read by the grammar library (%s: %s)", type(err).__name__, err)
        return None


# Normalizers that never make a text shorter; any other one might (NFC composes "e" and a
# combining accent into "é"), so the bound below leaves it a margin.
_KEEPS_LENGTH = {"Prepend", "NFD", "NFKD", "Lowercase", "Sequence"}
NORMALIZER_MARGIN = 4


def longest_token_chars(tokenizer: object) -> int:
    """The most characters of text one token of ``tokenizer`` can stand for.

    A vocabulary entry is spelled in the tokenizer's own alphabet: a byte-level BPE token of
    n bytes is n characters long and covers at most n characters of text (each is at least
    one byte); a SentencePiece piece covers its own length (``▁`` is one space); a byte
    fallback ``<0x41>`` covers one. So the longest entry bounds every token, and a text of
    more than ``max_prompt_tokens`` times it cannot tokenize into ``max_prompt_tokens`` tokens.
    A normalizer that can shorten text first gets a ×4 margin (``NORMALIZER_MARGIN``).
    """
    vocab = tokenizer.get_vocab()  # added and special tokens included
    longest = max(map(len, vocab), default=1)
    return max(1, longest) * (1 if _normalizer_keeps_length(tokenizer) else NORMALIZER_MARGIN)


def _normalizer_keeps_length(tokenizer: object) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False  # a slow tokenizer: its normalisation is Python code we cannot read
    spec = json.loads(backend.to_str()).get("normalizer")
    parts, pending = [], [spec]
    while pending:
        part = pending.pop()
        if part is None:
            continue
        parts.append(part)
        pending.extend(part.get("normalizers") or [])
    for part in parts:
        kind = part.get("type")
        if kind == "Replace":
            pattern = part.get("pattern", {})
            if "String" not in pattern or len(part.get("content", "")) < len(pattern["String"]):
                return False
        elif kind not in _KEEPS_LENGTH:
            return False
    return True
