"""Hugging Face causal LMs with iteration-level batching over a plain ``DynamicCache``.

The running batch is a value with two operations, as in TGI's ``CausalLMBatch``:
``_merge`` (prefilled newcomers join: both KV caches are left-padded to one length and
concatenated on the batch axis) and ``_filter`` (finished or cancelled rows leave, and cache
columns that only padding uses are trimmed). Every row keeps its own attention mask and
explicit ``position_ids``, so left padding never shifts a row's positions: that is what keeps
GPT-2's learned positions and Llama's RoPE exact.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.utils import logging as hf_logging

from . import kv_cache
from .base import Engine, EngineInfo, StepPlan
from .sampling import sample

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
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def default_num_threads() -> int:
    """All cores on a small machine; leave two for kernels and the server on a big one."""
    cores = os.cpu_count() or 1
    return cores if cores <= 4 else cores - 2


def left_pad_rows(rows: Seq[Seq[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one left-padded batch (on the CPU): ids and attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids, mask


@dataclass
class _Batch:
    """The running rows: their ids, KV cache, attention mask, next positions and last tokens."""

    ids: list[str]
    cache: DynamicCache
    mask: torch.Tensor  # [rows, cache_len] 1 = real token
    positions: torch.Tensor  # [rows] position id of the next token
    last: torch.Tensor  # [rows] the token to feed next


class HFEngine(Engine):
    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        num_threads: int = 0,
        local_files_only: bool = False,
    ) -> None:
        hf_logging.disable_progress_bar()  # a server log is no place for tqdm bars
        self.device = pick_device(device)
        torch_dtype = pick_dtype(dtype, self.device)
        if self.device == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
        self.tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=local_files_only)
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch_dtype, local_files_only=local_files_only
        ).to(self.device)
        self.model.eval()
        config = self.model.config
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0)
        max_context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048)
        self.info = EngineInfo(
            engine="hf",
            model=model,
            device=self.device,
            dtype=str(torch_dtype).removeprefix("torch."),
            max_context=int(max_context),
            details={
                "architecture": (config.architectures or [type(self.model).__name__])[0],
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "num_threads": torch.get_num_threads(),
                "chat_template": bool(getattr(self.tokenizer, "chat_template", None)),
            },
        )
        self._batch: _Batch | None = None
        self._generators: dict[str, torch.Generator] = {}

    # -- text -------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def detokenize(self, token_ids: Seq[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return super().render_chat(messages)

    # -- steps ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return 0 if self._batch is None else len(self._batch.ids)

    def step(self, plan: StepPlan) -> list[int]:
        self.release(plan.release)
        with torch.inference_mode():
            if plan.kind == "prefill":
                return self._prefill(plan.seqs)
            return self._decode(plan.seqs)

    def reset(self) -> None:
        self._batch = None
        self._generators.clear()

    def _prefill(self, seqs: list[Sequence]) -> list[int]:
        input_ids, mask = left_pad_rows([s.prompt_ids for s in seqs], self.pad_token_id)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        input_ids, mask, position_ids = (t.to(self.device) for t in (input_ids, mask, position_ids))
        cache = kv_cache.new_cache(self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        tokens = self._sample(out.logits[:, -1, :], seqs)
        newcomers = _Batch(
            ids=[s.id for s in seqs],
            cache=out.cache,
            mask=mask,
            positions=mask.sum(-1),
            last=torch.tensor(tokens, dtype=torch.long, device=self.device),
        )
        self._batch = newcomers if self._batch is None else _merge(self._batch, newcomers)
        return tokens

    def _decode(self, seqs: list[Sequence]) -> list[int]:
        batch = self._batch
        if batch is None or [s.id for s in seqs] != batch.ids:
            raise RuntimeError("decode step does not match the running batch")
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.ids), 1))], dim=-1)
        out = self.model(
            input_ids=batch.last[:, None],
            attention_mask=mask,
            position_ids=batch.positions[:, None],
            cache=batch.cache,
            use_cache=True,
        )
        tokens = self._sample(out.logits[:, -1, :], seqs)
        batch.cache = out.cache
        batch.mask = mask
        batch.positions = batch.positions + 1
        batch.last = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return tokens

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        return sample(logits, [s.params for s in seqs], [self._generator(s) for s in seqs])

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.greedy:
            return None
        gen = self._generators.get(seq.id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            if seq.params.seed is not None:
                gen.manual_seed(seq.params.seed)
            else:
                gen.seed()
            self._generators[seq.id] = gen
        return gen

    def release(self, row_ids: Seq[str]) -> None:
        if row_ids:
            self._filter(set(row_ids))

    def _filter(self, leaving: set[str]) -> None:
        for row_id in leaving:
            self._generators.pop(row_id, None)
        batch = self._batch
        if batch is None:
            return
        keep = [i for i, row_id in enumerate(batch.ids) if row_id not in leaving]
        if len(keep) == len(batch.ids):
            return
        if not keep:
            self._batch = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = batch.mask[index]
        # Columns that only departed rows used are pure padding now: trim them.
        start = int(mask.any(dim=0).nonzero()[0])
        kv_cache.select_rows(batch.cache, index, start)
        batch.ids = [batch.ids[i] for i in keep]
        batch.mask = mask[:, start:]
        batch.positions = batch.positions[index]
        batch.last = batch.last[index]


def _merge(running: _Batch, newcomers: _Batch) -> _Batch:
    """Concatenate two batches on the row axis, left-padding the shorter one."""
    width = max(running.mask.shape[1], newcomers.mask.shape[1])
    return _Batch(
        ids=running.ids + newcomers.ids,
        cache=kv_cache.merge(running.cache, newcomers.cache, width),
        mask=torch.cat([kv_cache.left_pad(running.mask, width, 1), kv_cache.left_pad(newcomers.mask, width, 1)]),
        positions=torch.cat([running.positions, newcomers.positions]),
        last=torch.cat([running.last, newcomers.last]),
    )
