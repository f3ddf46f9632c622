"""Hugging Face causal LMs with iteration-level batching over a plain ``DynamicCache``.

The running batch is a value with two operations, as in TGI's ``CausalLMBatch``:
``concatenate`` (prefilled newcomers join: both KV caches are left-padded to one length and
concatenated on the batch axis) and ``filter`` (finished or cancelled rows leave, and cache
columns that only padding uses are trimmed). Per-row sampling state (each row's
``RowSampler``: parameters, RNG, logits processors) lives in the batch beside the tensors.
A long prompt prefilled in chunks is a one-row batch of its own until its last chunk, when it
joins the decoding rows. Every row keeps its own attention mask and
explicit ``position_ids``, so left padding never shifts a row's positions: that is what keeps
GPT-2's learned positions and Llama's RoPE exact. The decoding rows are length buckets of
such batches (``buckets.py``), all run by one forward (``ragged.py``), and rows that start with
a prefix another running row starts with hold it once (``shared_prefix.py``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from transformers.utils import logging as hf_logging

from ...constraints.grammar import GrammarCompiler, masks_beside
from ...cpu import build, kernels
from ...cpu.cpu_share import CpuShare
from ...cpu.model_linears import LinearReport
from ...decoding.sampling import RowSampler, grammar_rows, sample
from ...decoding.step_cost import StepCost
from ...formats import gguf_load
from ...formats.device_choice import check_quantize, default_num_threads, pick_device, pick_dtype
from ...formats.hf_load import (
    check_format,
    checkpoint_files,
    held_dtype,
    load_causal_lm,
    parameter_count,
)
from ...speculative import proposals
from ...speculative.draft_model import DraftModel
from ...text.generation_defaults import sampling_defaults
from ...text.hf_text import HFText, load_tokenizer
from ...values import load_progress
from ...values.engine_info import EngineInfo
from ..base import Engine, KVUsage, RowTable, Sampled
from ..kv import kv_cache
from ..kv.prefix_cache import BLOCK_TOKENS, PrefixCache
from ..kv.prompt_disk import DiskBlocks, model_key, prompts_root
from ..kv.shared_prefix import Claim, SharedPrefixes
from . import draft_columns, pooling, ragged
from .batch import HFBatch
from .buckets import Buckets
from .llama_forward import LlamaForward
from .prompt_work import PromptChunk, PromptsDone, Start, WholePrompts, prompt_work
from .row import Row

if TYPE_CHECKING:
    from ...values.step import RowRequest

log = logging.getLogger(__name__)


class HFEngine(Engine):
    mixes_steps = True  # newcomers' prompt blocks run in the decoding rows' forward (ragged.py)
    # The decoding rows as length buckets; a prompt part-way, its one-row batch so far.
    rows: RowTable[Buckets, HFBatch]

    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        num_threads: int = 0,
        local_files_only: bool = False,
        prefix_cache_mb: float = 0,
        prefix_cache_disk_mb: float = 0,
        prepack_weights: bool = True,
        quantize: str = "none",
        draft_model: str = "",
        draft_local_files_only: bool | None = None,
        generation_defaults: bool = True,
        split_reasoning: bool = True,
        tool_call_format: str = "",
    ) -> None:
        super().__init__()
        hf_logging.disable_progress_bar()  # a server log is no place for tqdm bars
        torch_dtype, linears, tokenizer = self._read(model, device, dtype, num_threads, local_files_only, quantize,
                                                     prepack_weights)
        load_progress.current().phase("getting ready to serve (grammars, draft model, forward)")
        parameters = parameter_count(self.model)
        config = self.model.config
        self.text = HFText(tokenizer, self.model.generation_config, tool_call_format=tool_call_format,
                           split_reasoning=split_reasoning)
        eos = self.text.eos_token_ids
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (min(eos) if eos else 0)
        self.logits_width = int(config.vocab_size)  # what a grammar's mask covers
        self.grammars = _grammars(tokenizer, self.logits_width, eos)
        self.draft = DraftModel.load(draft_model, tokenizer, self.logits_width, kv=kv_cache, device=self.device,
                                     dtype=torch_dtype, prepack=prepack_weights,
                                     local_files_only=local_files_only if draft_local_files_only is None
                                     else draft_local_files_only) if draft_model else None
        # Rows can continue from stored KV (chunked prefill, prefix caching) when every layer
        # attends to the whole past; sliding-window layers would need their window kept.
        self._reusable = kv_cache.reusable(config)
        # One forward over every length bucket (ragged.py) where rows can continue from their
        # own KV; otherwise a forward per bucket, through the model's own attention.
        self.ragged = self._reusable and ragged.install(self.model)
        # The Llama family's own forward (our kernels, no module tree); None: transformers' modules.
        self.llama_forward = LlamaForward.of(self.model) if self.ragged else None
        # On a CPU, 64-token chunks keep a running stream's worst stall near 0.15x of an
        # 800-token prefill for 1.5x its TTFT (docs/engine.md); a GPU prefills so fast that
        # small chunks would only add steps.
        self.prefill_chunk_tokens = (64 if self.device == "cpu" else 512) if self._reusable else 0
        # A prompt alone, 4096 tokens a step on the CPU: its activations bounded, and a ~3k-token
        # prompt (an agent's usual) still whole (a step after the first attends through a mask:
        # an 8k-token prompt in 2048-token steps took 8 % longer than whole).
        self.prefill_step_tokens = 4096 if self.device == "cpu" and self._reusable else 0
        kv_dtype = held_dtype(self.model, torch_dtype)
        self.kv_bytes_per_token = kv_cache.bytes_per_token(config, kv_dtype)
        # What the KV computed here depends on, beyond the checkpoint: a key of its blocks on disk.
        self._kv_form = (model, quantize, linears.kernels, kv_dtype)
        self.prefix_cache: PrefixCache | None = None
        self.configure_prefix_cache(prefix_cache_mb, prefix_cache_disk_mb)
        # What one more length bucket costs a decode step, in bytes read (buckets.py). With one
        # forward over all of them: its attention calls, ~90 us a layer on the 2-core CPU
        # machine, what reading ~1 MB of KV takes there; on a GPU a launch is worth far more
        # bytes (~20 us at ~3 TB/s: ~64 MB; an estimate, no GPU measured). With a forward
        # each: a second read of every weight.
        per_layer = 2**20 if self.device == "cpu" else 64 * 2**20
        self.bucket_bytes = config.num_hidden_layers * per_layer if self.ragged else self.load.weight_bytes
        self.info = self._engine_info(model, torch_dtype, parameters, linears, quantize)
        if generation_defaults:
            self.info.sampling_defaults = sampling_defaults(self.model.generation_config)
        self.info.reasoning = self.text.reasons
        # How wide a forced run is fed (step_cost: its pad columns stay in the bucket's cache).
        # On the CPU only: a GPU's forward returns before it ran, and is overhead-bound anyway.
        self.step_cost = StepCost() if self.device == "cpu" else None

    def _read(self, model: str, device: str, dtype: str, num_threads: int, local_files_only: bool,
              quantize: str, prepack: bool) -> tuple[torch.dtype, LinearReport, Any]:
        """The model, on the device and in the dtype chosen for it, and its tokenizer."""
        check_format(model)
        self.device = pick_device(device)
        torch_dtype = pick_dtype(dtype, self.device)
        gguf = gguf_load.is_gguf(model)
        if quantize != "none":
            check_quantize(quantize, self.device)  # refused off the CPU
        if (quantize != "none" or gguf) and self.device == "cpu" and dtype == "auto":
            torch_dtype = torch.float32  # what the int8 and int4 kernels take and give
        if self.device == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
            # Fewer threads beside a busy neighbour, where the user left the count to us.
            self.cpu_share = CpuShare(torch.get_num_threads(), adapt=not num_threads)
        load_progress.current().phase("reading the tokenizer")
        tokenizer = load_tokenizer(model, local_files_only)
        self.model, linears, self.load = load_causal_lm(
            model, dtype=torch_dtype, device=self.device, local_files_only=local_files_only,
            quantize=quantize, prepack=prepack)
        return torch_dtype, linears, tokenizer

    def _engine_info(self, model: str, dtype: torch.dtype, parameters: int, linears: LinearReport,
                     quantize: str) -> EngineInfo:
        config = self.model.config
        max_context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048)
        draft = {"draft_model": self.draft.name, "draft_parameters": self.draft.parameters} if self.draft else {}
        return EngineInfo(
            engine="hf",
            model=model,
            device=self.device,
            dtype=str(dtype).removeprefix("torch."),
            max_context=int(max_context),
            tool_calls={"format": self.text.tool_format.name,
                        "prompt": "chat template" if self.text.renders_tools else "built-in"},
            details={
                "architecture": (config.architectures or [type(self.model).__name__])[0],
                "parameters": parameters,
                "num_threads": torch.get_num_threads(),
                "linear_kernels": linears.kernels,
                # Whether our CPU kernels serve here, or why not (their probe: cpu/build.py).
                **({"cpu_kernels": kernels.status()} if self.device == "cpu" else {}),
                "quantize": quantize,
                "prepack_s": round(linears.seconds, 3),
                **({"weight_cache": linears.cache} if linears.cache else {}),
                "forward": self.forward_path(),
                **self.load.details(),
                "chat_template": self.text.has_template,
                **({"fim": self.text.fim.family} if self.text.fim else {}),
                **draft,
            },
        )

    def forward_path(self) -> str:
        """How a step's forward runs here, as ``infer/status`` says it."""
        if self.llama_forward is not None:
            one_call = " (a decode step's layers in one C call)" if self.llama_forward.one_call else ""
            return f"ours, the Llama family's{one_call}: every bucket in one forward"
        if self.ragged:
            return "transformers' modules, every bucket in one forward"
        return "transformers' modules, a forward per bucket"

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    # -- steps ------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, seqs: list[RowRequest], num_scheduled: list[int]) -> Sampled:
        """Whole prompts in one forward; a long prompt alone, a chunk at a time (its row in
        ``rows.prefilling`` until the last)."""
        work, rest = prompt_work(self, seqs, num_scheduled, self.rows.prefilling)
        masks = masks_beside(grammar_rows(r.sampler for r in work.rows), self.logits_width)
        logits = self._forward(work.blocks, every=work.echo)
        if masks is not None:
            masks.result()
        return self._took(work.finish(logits, work.echo), rest)

    def _took(self, finished: PromptsDone, rest: dict[str, HFBatch]) -> Sampled:
        """The prompt rows' tokens; complete rows join the decoding rows, begun ones wait."""
        self.rows.prefilling = {**rest, **finished.begun}
        self.rows.join(finished.complete)
        return finished.sampled

    def buckets(self, batches: list[HFBatch]) -> Buckets:
        """Newly complete rows, as the decoding rows hold them: a group of very different
        lengths is split already (``concatenate`` regroups them with the rows running)."""
        buckets = Buckets(batches, self.bucket_bytes, self.kv_bytes_per_token)
        buckets.rebalance()
        return buckets

    def remember(self, prompt: list[int], start: Start, block: ragged.Block, row: int) -> None:
        """Put the full blocks of a row's prompt, just prefilled in ``block``, in the prefix
        cache (those it lacks: a shared or cached start is there already)."""
        if self.prefix_cache is None:
            return
        shared, n, _ = start
        offset = shared.length if shared is not None else 0
        columns, rest = block.mask.shape[1], len(prompt) - n
        past = columns - block.ids.shape[1]  # the block's cached columns, before its new ones

        def kv_of(a: int, b: int) -> torch.Tensor:  # blocks never straddle a region: all are whole blocks
            if b <= offset:
                return shared.kv[:, :, :, a:b]
            if b <= n:  # cached token j (after the shared prefix) sits in column past - n + j
                return kv_cache.row_kv(block.cache, row, past - n + a, past - n + b)
            return kv_cache.row_kv(block.cache, row, columns - rest + a - n, columns - rest + b - n)

        self.prefix_cache.insert(prompt, len(prompt), kv_of)

    def cached_start(self, seq: RowRequest) -> Start:
        """Where ``seq``'s row starts: the shared prefix it refers to (held once: ``None`` if
        none, or where the model runs no blocks), how many prompt tokens are cached (shared
        ones included) and the KV of the cached ones after the shared prefix, for the row's own
        cache (``None``: none)."""
        n, kv = self._cached_prefix(seq)
        shared = self._shared.share(seq.prompt_ids, n, kv) if n and self._shared is not None else None
        if shared is None:
            return None, n, kv
        return shared, n, kv[:, :, :, shared.length :].contiguous() if shared.length < n else None

    def claim(self, seq: RowRequest) -> Claim | None:
        """The row's claim on its prompt's blocks, which newcomers may share while it runs."""
        return self._shared.claim(seq.prompt_ids) if self._shared is not None else None

    def _cached_prefix(self, seq: RowRequest) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``seq``'s prompt (0 and ``None`` without a cache, or
        for a row that wants its prompt's logprobs: those need every prompt position's logits)."""
        if self.prefix_cache is None or seq.params.prompt_logprobs is not None:
            return 0, None
        return self.prefix_cache.match(seq.prompt_ids)

    def configure_prefix_cache(self, megabytes: float, disk_megabytes: float = 0) -> None:
        """A fresh, empty prefix cache of ``megabytes`` (0: none) that also keeps its blocks on
        disk, ``disk_megabytes`` of them (0: in memory only); running rows start from its
        blocks by reference to one shared copy where the model runs blocks (``ragged``)."""
        self.close()
        self.prefix_cache = None
        self._shared: SharedPrefixes | None = None
        if megabytes > 0 and self._reusable:
            self.prefix_cache = PrefixCache(int(megabytes * 2**20), disk=self._disk_blocks(disk_megabytes))
            if self.ragged:
                self._shared = SharedPrefixes(self.prefix_cache.block_tokens)

    def _computed_by(self, linears: str) -> str:
        """How this engine's keys and values are computed: its linears, forward, prompt attention
        and kernel build (another build of our kernels may round differently)."""
        prompt_in_c = self.llama_forward is not None and self.llama_forward.prompt_in_c
        return f"{linears} | {self.forward_path()} | prompt attention in C: {prompt_in_c} | kernels {build.library_key()}"

    def _disk_blocks(self, megabytes: float) -> DiskBlocks | None:
        """This model's prefix-cache blocks on disk (``prompt_disk.py``), or None: off, off the
        CPU (a GPU's prefill is fast, and its blocks are device tensors), no checkpoint file to
        key them by, or no folder that can be written."""
        model, quantize, linears, dtype = self._kv_form
        files = checkpoint_files(model) if megabytes > 0 and self.device == "cpu" else []
        if not files:
            return None
        shape = kv_cache.block_shape(self.model.config, BLOCK_TOKENS)
        key = model_key(files, quantize, self._computed_by(linears), shape, dtype)
        try:
            return DiskBlocks(prompts_root() / key, key, int(megabytes * 2**20), shape, dtype)
        except OSError as err:
            log.warning("jupyter_infer: prompts are cached in memory only: %s (%s)", prompts_root(), err)
            return None

    def close(self) -> None:
        """Write the prefix cache's queued blocks to disk and stop its writer (the blocks in
        memory stay: an engine a bench reuses for another service keeps its cache)."""
        cache = self.prefix_cache
        if cache is not None and cache.disk is not None:
            disk, cache.disk = cache.disk, None
            disk.close()

    def decoding_buckets(self) -> list[HFBatch]:
        """The decoding rows as the next decode step runs them: a dense ``HFBatch`` per length
        bucket, in the engine's order (a view, for reading: ``execute`` alone changes them)."""
        return list(self.rows.decoding or ())

    def kv_usage(self) -> KVUsage:
        rows = self.rows
        batches = [*(rows.decoding or ()), *rows.prefilling.values(),
                   *(b for parked in rows.parked.values() for b in parked)]
        # A shared prefix counts once, however many rows start with it.
        shared = {id(b.shared.root): b.shared.root for b in batches if b.shared is not None}.values()
        return KVUsage(
            bytes_held=sum(kv_cache.bytes_held(b.cache) for b in batches) + sum(s.nbytes for s in shared),
            tokens_held=sum(int(b.mask.sum()) for b in batches) + sum(s.length for s in shared),
            bytes_per_token=self.kv_bytes_per_token,
            shared_tokens=sum(s.length for s in shared),
            state_bytes=sum(kv_cache.state_bytes(b.cache) for b in batches),
        )

    def prefix_cache_stats(self) -> dict[str, Any] | None:
        if self.prefix_cache is None:
            return {"enabled": False, "reason": "off (prefix_cache_mb = 0)" if self._reusable
                    else "this model's cache has sliding-window layers"}
        return self.prefix_cache.stats()

    def configure_speculation(self, method: str, tokens: int, max_rows: int) -> None:
        if not self._reusable or not tokens or (method == "draft" and self.draft is None):
            method = "off"  # drafts are cut off a row's KV when refused: its layers must keep it all
        self.speculative_method, self.speculative_max_rows = method, max_rows
        self.speculative_tokens = tokens if method != "off" else 0

    embeds = True

    def embed(self, rows: list[RowRequest]) -> list[list[float]]:
        return pooling.embeddings(self.model.base_model, [r.prompt_ids for r in rows], self.pad_token_id, self.device)

    def decode(self, seqs: list[RowRequest], guesses: dict[str, int] | None = None) -> Sampled:
        """Every row's next tokens, all buckets in one forward (``_forward``), in the batch's
        order; a row feeds a grammar's forced run, or draft tokens to verify (draft_columns.py)."""
        return self._step(seqs, guesses, None)[0]

    @torch.inference_mode()
    def mixed(
        self, decoding: list[RowRequest], seqs: list[RowRequest], num_scheduled: list[int],
        guesses: dict[str, int] | None = None,
    ) -> Sampled:
        """The decoding rows' step and the prompt tokens ``prefill`` would run, in one forward:
        the prompts' blocks beside the buckets' (``ragged.py``), so newcomers cost the
        decoding rows their tokens' share of a step, not a step of their own."""
        work, rest = prompt_work(self, seqs, num_scheduled, self.rows.prefilling)
        decoded, finished = self._step(decoding, guesses, work)
        return decoded + self._took(finished, rest)

    @torch.inference_mode()
    def _step(self, seqs: list[RowRequest], guesses: dict[str, int] | None,
              prompts: WholePrompts | PromptChunk | None) -> tuple[Sampled, PromptsDone | None]:
        """The decoding rows' tokens (the batch's order) and, with ``prompts``, what their
        ``finish`` gives, from one forward over the buckets' blocks then the prompts'."""
        buckets = list(self.rows.decoding)
        rows = [r for bucket in buckets for r in bucket.rows]
        extra = prompts.blocks if prompts is not None else []
        masks = masks_beside(grammar_rows(r.sampler for r in rows + (prompts.rows if prompts is not None else [])),
                             self.logits_width)
        drafts = {}
        if guesses and self.speculative_method != "off":
            drafts = proposals.drafts(rows, seqs, guesses, self.draft if self.speculative_method == "draft" else None)
        blocks = [bucket.next_block(self.pad_token_id, drafts) for bucket in buckets]
        every = bool(drafts) or (prompts is not None and prompts.echo)
        started = time.perf_counter()
        logits = self._forward(blocks + extra, every=every)
        cost = self.step_cost
        if cost is not None and prompts is None:  # what a decode step costs by its width
            cost.add(sum(block.ids.numel() for block in blocks), time.perf_counter() - started)
        split = sum(block.tokens if every else block.ids.shape[0] for block in blocks)
        logits, theirs = logits[:split], logits[split:]
        if masks is not None:
            masks.result()
        if drafts:
            sampled = draft_columns.verify(logits, blocks, buckets, drafts)
        else:
            if every:  # the prompts' echo kept every column: each row's last one
                logits = logits[ragged.last_columns(blocks)]
            sampled = sample(logits, [r.sampler for r in rows], cost.width if cost is not None else None)
            tokens = iter([o.tokens for o in sampled])
            for bucket, block in zip(buckets, blocks, strict=True):
                bucket.advance(block, [next(tokens) for _ in bucket.rows])
        # in the batch's order, as seqs are (Engine.execute answers in the plan's)
        return sampled, (prompts.finish(theirs, every) if prompts is not None else None)

    def _forward(self, blocks: list[ragged.Block], every: bool = False) -> torch.Tensor:
        """The model over ``blocks``: logits of each row's last column, block after block
        (``[rows, vocab]``), or with ``every`` of every column (``[tokens, vocab]``). One forward
        (``ragged.forward``) where the model allows it; else one per block."""
        if self.ragged:
            return ragged.forward(self.model, blocks, every, self.llama_forward)
        logits = []
        for block in blocks:
            out = self.model(input_ids=block.ids, attention_mask=block.mask, position_ids=block.positions,
                             cache=block.cache, use_cache=True, logits_to_keep=0 if every else 1)
            logits.append(out.logits.flatten(0, 1))
        return torch.cat(logits)

    def new_row(self, seq: RowRequest) -> Row:
        """A newcomer's row: its sampler (its claim on its prompt comes once it is prefilled)."""
        return Row(seq.id, RowSampler.build(seq.params, seq.prompt_ids, self.text.eos_token_ids, self.device,
                                            seq.grammar))


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
