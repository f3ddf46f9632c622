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
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from ..constraints import tool_formats
from ..constraints.grammar import GrammarCompiler, masks_beside
from ..errors import InvalidRequest
from ..values.engine_info import EngineInfo
from . import gguf_load, kv_cache, ragged, speculate
from .base import Engine, KVUsage, Rows, Sampled
from .buckets import Buckets
from .cpu_linear import LinearReport
from .draft_model import DraftModel
from .generation_defaults import reasons, sampling_defaults
from .hf_batch import HFBatch, left_pad_rows, row_ends, spare_columns
from .hf_device import check_quantize, default_num_threads, pick_device, pick_dtype
from .hf_load import check_format, load_causal_lm, parameter_count
from .prefix_cache import PrefixCache
from .sampling import RowSampler, grammar_rows, prompt_logprobs, sample
from .shared_prefix import Claim, SharedPrefix, SharedPrefixes
from .step_cost import StepCost
from .token_bound import longest_token_chars

if TYPE_CHECKING:
    from ..values.sequence import Sequence

log = logging.getLogger(__name__)

# Where a row starts: the shared prefix it refers to, its cached prompt tokens (shared ones
# included), the KV of the cached ones after the shared prefix.
Start = tuple["SharedPrefix | None", int, "torch.Tensor | None"]

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
        draft_model: str = "",
        draft_local_files_only: bool | None = None,
        generation_defaults: bool = True,
        split_reasoning: bool = True,
        tool_call_format: str = "",
    ) -> None:
        hf_logging.disable_progress_bar()  # a server log is no place for tqdm bars
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
        self.tokenizer = (gguf_load.load_tokenizer(model) if gguf
                          else AutoTokenizer.from_pretrained(model, local_files_only=local_files_only))
        self.model, linears, self.load = load_causal_lm(
            model, dtype=torch_dtype, device=self.device, local_files_only=local_files_only,
            quantize=quantize, prepack=prepack_weights)
        parameters = parameter_count(self.model)
        # What one forward reads of the weights: the cost of one more length bucket's decode
        # step (buckets.py).
        weight_bytes = self.load.weight_bytes
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
        self.draft = DraftModel.load(draft_model, self.tokenizer, self.logits_width, device=self.device,
                                     dtype=torch_dtype, prepack=prepack_weights,
                                     local_files_only=local_files_only if draft_local_files_only is None
                                     else draft_local_files_only) if draft_model else None
        # Rows can continue from stored KV (chunked prefill, prefix caching) when every layer
        # attends to the whole past; sliding-window layers would need their window kept.
        self._reusable = kv_cache.reusable(config)
        # One forward over every length bucket (ragged.py) where rows can continue from their
        # own KV; otherwise a forward per bucket, through the model's own attention.
        self._ragged = self._reusable and ragged.install(self.model)
        # On a CPU, 64-token chunks keep a running stream's worst stall near 0.15x of an
        # 800-token prefill for 1.5x its TTFT (docs/engine.md); a GPU prefills so fast that
        # small chunks would only add steps.
        self.prefill_chunk_tokens = (64 if self.device == "cpu" else 512) if self._reusable else 0
        self.configure_prefix_cache(prefix_cache_mb)
        self.kv_bytes_per_token = kv_cache.bytes_per_token(config, torch_dtype)
        # What one more length bucket costs a decode step, in bytes read (buckets.py). With one
        # forward over all of them: its attention calls, ~90 us a layer on the 2-core CPU
        # machine, what reading ~1 MB of KV takes there; on a GPU a launch is worth far more
        # bytes (~20 us at ~3 TB/s: ~64 MB; an estimate, no GPU measured). With a forward
        # each: a second read of every weight.
        per_layer = 2**20 if self.device == "cpu" else 64 * 2**20
        self.bucket_bytes = config.num_hidden_layers * per_layer if self._ragged else weight_bytes
        self.tool_format, self.renders_tools, self.tool_specials = tool_formats.of_tokenizer(
            self.tokenizer, tool_call_format)
        self.info = self._engine_info(model, torch_dtype, parameters, linears, quantize)
        if generation_defaults:
            self.info.sampling_defaults = sampling_defaults(self.model.generation_config)
        self.info.reasoning = split_reasoning and reasons(self.tokenizer)
        # What a decode step costs here: how wide a forced run is fed (step_cost). On the CPU
        # only: a GPU's forward returns before it ran, and its steps are overhead-bound anyway.
        self.step_cost = StepCost() if self.device == "cpu" else None

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
            tool_calls={"format": self.tool_format.name,
                        "prompt": "chat template" if self.renders_tools else "built-in"},
            details={
                "architecture": (config.architectures or [type(self.model).__name__])[0],
                "parameters": parameters,
                "num_threads": torch.get_num_threads(),
                "linear_kernels": linears.kernels,
                "quantize": quantize,
                "prepack_s": round(linears.seconds, 3),
                **self.load.details(),
                "chat_template": bool(getattr(self.tokenizer, "chat_template", None)),
                **draft,
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

    def render_chat(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          tools=tools, **(template_kwargs or {}))
            except (TemplateError, TypeError, ValueError, KeyError, AttributeError, RecursionError) as err:
                # "Conversation roles must alternate user/assistant", a template's own
                # raise_exception, one that reads a field these messages lack, or tools
                # nested too deep for its ``tojson``.
                raise InvalidRequest(f"The model's chat template refused these messages: {err}",
                                     param="messages") from None
        return super().render_chat(messages, template_kwargs, tools)

    # -- steps ------------------------------------------------------------------------------
    def prefill(
        self, seqs: list[Sequence], num_scheduled: list[int], partial: dict[str, HFBatch],
    ) -> tuple[Sampled, Buckets | None, dict[str, HFBatch]]:
        """Whole prompts in one forward; a long prompt alone, a chunk at a time (``partial``)."""
        seq = seqs[0]
        if len(seqs) == 1 and (seq.id in partial or num_scheduled[0] < seq.num_uncomputed):
            sampled, row = self._prefill_chunk(seq, partial.get(seq.id), num_scheduled[0])
            rest = {i: r for i, r in partial.items() if i != seq.id}
            if sampled.tokens[0]:
                return sampled, self._buckets([row]), rest
            return sampled, None, {**rest, seq.id: row}
        sampled, batches = self._prefill_whole(seqs)
        return sampled, self._buckets(batches), partial

    def _buckets(self, batches: list[HFBatch]) -> Buckets:
        """Newly complete rows, as the decoding rows hold them: a group of very different
        lengths is split already (``concatenate`` regroups them with the rows running)."""
        buckets = Buckets(batches, self.bucket_bytes, self.kv_bytes_per_token)
        buckets.rebalance()
        return buckets

    @torch.inference_mode()
    def _prefill_whole(self, seqs: list[Sequence]) -> tuple[Sampled, list[HFBatch]]:
        """The newcomers' prompts in one forward: a block per shared prefix they start with
        (or none). A row whose prompt starts with a cached prefix starts from that KV, shared
        or copied: its row reads ``[pad | cached | pad | rest]``, the mask hides both pads and
        ``position_ids`` continue from the cached length."""
        starts = [self._cached_start(s) for s in seqs]
        lots: dict[int, list[int]] = {}  # the rows after each shared prefix, in the plan's order
        for i, (shared, _, _) in enumerate(starts):
            lots.setdefault(id(shared), []).append(i)
        order = [i for rows in lots.values() for i in rows]
        blocks = [self._prompt_block([seqs[i] for i in rows], [starts[i] for i in rows]) for rows in lots.values()]
        samplers = [self._sampler(seqs[i]) for i in order]
        masks = masks_beside(grammar_rows(samplers), self.logits_width)
        # Logits of every position only when a row asks for its prompt's logprobs.
        echo = any(s.params.prompt_logprobs is not None for s in seqs)
        logits = self._forward(blocks, every=echo)
        every, logits = (logits, logits[ragged.last_columns(blocks)]) if echo else (None, logits)
        echoed: dict[int, list] = {}  # row in the plan -> its prompt's logprobs
        first = 0
        for rows, block in zip(lots.values(), blocks, strict=True):
            for row, i in enumerate(rows):
                self._remember(seqs[i].prompt_ids, starts[i], block, row)
                prompt = seqs[i].prompt_ids
                if every is not None and seqs[i].params.prompt_logprobs is not None:
                    own = every[first : first + block.tokens].unflatten(0, block.ids.shape)[row, -len(prompt):]
                    echoed[i] = prompt_logprobs(own, prompt, seqs[i].params.prompt_logprobs)
            first += block.tokens
        if masks is not None:
            masks.result()
        sampled = sample(logits, samplers)
        batches, at = [], 0
        for rows, block in zip(lots.values(), blocks, strict=True):
            tokens = sampled.tokens[at : at + len(rows)]
            at += len(rows)
            batches.append(HFBatch(
                ids=[seqs[i].id for i in rows],
                cache=block.cache,
                mask=block.mask,
                positions=torch.tensor([len(seqs[i].prompt_ids) for i in rows], device=self.device),
                ends=row_ends([(len(seqs[i].prompt_ids), seqs[i].params.max_tokens) for i in rows], self.device),
                last=torch.tensor([t[-1] for t in tokens], dtype=torch.long, device=self.device),
                samplers=samplers[at - len(rows) : at],
                forced={seqs[i].id: t for i, t in zip(rows, tokens, strict=True) if len(t) > 1},
                shared=block.shared,
                claims=[self._claim(seqs[i]) for i in rows],
            ))
        sampled = sampled.reorder([order.index(i) for i in range(len(seqs))])
        if echo:
            sampled.prompt_logprobs = [echoed.get(i) for i in range(len(seqs))]
        return sampled, batches

    def _prompt_block(self, seqs: list[Sequence], starts: list[Start]) -> ragged.Block:
        """The prompts of rows after one shared prefix (or none) as one left-padded block: each
        row's cached part after that prefix, padding, the rest of its prompt."""
        shared = starts[0][0]
        offset = shared.length if shared is not None else 0
        own = [n - offset for _, n, _ in starts]  # cached columns in the row's own cache
        input_ids, new_mask = left_pad_rows([s.prompt_ids[n:] for s, (_, n, _) in zip(seqs, starts, strict=True)],
                                            self.pad_token_id)
        width = max(own)
        past_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, n in enumerate(own):
            past_mask[row, width - n :] = 1
        mask = torch.cat([past_mask, new_mask], dim=1)
        position_ids = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor([n for _, n, _ in starts])[:, None]
        config = self.model.config
        cache = kv_cache.with_past(config, [kv for _, _, kv in starts], width) if width else kv_cache.new_cache(config)
        kv_cache.set_spare(cache, spare_columns([s.params.max_tokens for s in seqs]))
        return ragged.Block(cache, *(t.to(self.device) for t in (input_ids, mask, position_ids)), shared)

    def _remember(self, prompt: list[int], start: Start, block: ragged.Block, row: int) -> None:
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

    @torch.inference_mode()
    def _prefill_chunk(self, seq: Sequence, partial: HFBatch | None, budget: int) -> tuple[Sampled, HFBatch]:
        """Up to ``budget`` more prompt tokens of ``seq``, continuing ``partial`` (the row so
        far; ``None``: start, from the longest cached prefix). One row, no padding: the mask
        is all ones and positions continue from the tokens already there. The row's first
        token comes with the prompt's last chunk."""
        prompt = seq.prompt_ids
        samplers = partial.samplers if partial is not None else [self._sampler(seq)]
        if partial is None:
            shared, done, kv = self._cached_start(seq)
            offset = shared.length if shared is not None else 0
            config = self.model.config
            cache = kv_cache.with_past(config, [kv], done - offset) if done > offset else kv_cache.new_cache(config)
            for layer in cache.layers:  # room for the whole prompt at once, not a copy per chunk
                layer.reserve = len(prompt) - offset + spare_columns([seq.params.max_tokens])
        else:
            shared, cache = partial.shared, partial.cache
            offset = shared.length if shared is not None else 0
            done = offset + partial.mask.shape[1]
        end = min(len(prompt), done + budget)
        block = ragged.Block(cache, torch.tensor([prompt[done:end]], dtype=torch.long, device=self.device),
                             torch.ones((1, end - offset), dtype=torch.long, device=self.device),
                             torch.arange(done, end, device=self.device)[None], shared)
        logits = self._forward([block])
        if self.prefix_cache is not None:  # blocks complete so far: a prompt arriving now reuses them
            self.prefix_cache.insert(prompt, end, lambda a, b: shared.kv[:, :, :, a:b] if b <= offset
                                     else kv_cache.row_kv(cache, 0, a - offset, b - offset))
        complete = end == len(prompt)
        sampled = sample(logits, samplers) if complete else Sampled([[]], computed=[end])
        return sampled, HFBatch(
            ids=[seq.id], cache=cache, mask=block.mask,
            positions=torch.tensor([end], device=self.device),
            ends=row_ends([(len(prompt), seq.params.max_tokens)], self.device),
            # No token to feed yet while the prompt is incomplete: its row is not decoded.
            last=torch.tensor([sampled.tokens[0][-1] if complete else 0], dtype=torch.long, device=self.device),
            samplers=samplers,
            forced={seq.id: sampled.tokens[0]} if len(sampled.tokens[0]) > 1 else {},
            shared=shared,
            claims=partial.claims if partial is not None else [self._claim(seq)],
        )

    def _cached_start(self, seq: Sequence) -> Start:
        """Where ``seq``'s row starts: the shared prefix it refers to (held once: ``None`` if
        none, or where the model runs no blocks), how many prompt tokens are cached (shared
        ones included) and the KV of the cached ones after the shared prefix, for the row's own
        cache (``None``: none)."""
        n, kv = self._cached_prefix(seq)
        shared = self._shared.share(seq.prompt_ids, n, kv) if n and self._shared is not None else None
        if shared is None:
            return None, n, kv
        return shared, n, kv[:, :, :, shared.length :].contiguous() if shared.length < n else None

    def _claim(self, seq: Sequence) -> Claim | None:
        """The row's claim on its prompt's blocks, which newcomers may share while it runs."""
        return self._shared.claim(seq.prompt_ids) if self._shared is not None else None

    def _cached_prefix(self, seq: Sequence) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``seq``'s prompt (0 and ``None`` without a cache, or
        for a row that wants its prompt's logprobs: those need every prompt position's logits)."""
        if self.prefix_cache is None or seq.params.prompt_logprobs is not None:
            return 0, None
        return self.prefix_cache.match(seq.prompt_ids)

    def configure_prefix_cache(self, megabytes: float) -> None:
        """A fresh, empty prefix cache of ``megabytes`` (0: none); running rows start from its
        blocks by reference to one shared copy where the model runs blocks (``ragged``)."""
        self.prefix_cache = None
        self._shared: SharedPrefixes | None = None
        if megabytes > 0 and self._reusable:
            self.prefix_cache = PrefixCache(int(megabytes * 2**20))
            if self._ragged:
                self._shared = SharedPrefixes(self.prefix_cache.block_tokens)

    def kv_usage(self, rows: Rows | None) -> KVUsage:
        batches = [] if rows is None else [*(rows.decoding or ()), *rows.prefilling.values(),
                                           *(b for parked in rows.parked.values() for b in parked)]
        # A shared prefix counts once, however many rows start with it.
        shared = {id(b.shared.root): b.shared.root for b in batches if b.shared is not None}.values()
        return KVUsage(
            bytes_held=sum(kv_cache.bytes_held(b.cache) for b in batches) + sum(s.nbytes for s in shared),
            tokens_held=sum(int(b.mask.sum()) for b in batches) + sum(s.length for s in shared),
            bytes_per_token=self.kv_bytes_per_token,
            shared_tokens=sum(s.length for s in shared),
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

    @torch.inference_mode()
    def decode(self, batch: Buckets, seqs: list[Sequence]) -> Sampled:
        """Every row's next tokens, all buckets in one forward (``_forward``), in the batch's
        order; a row feeds a grammar's forced run, or draft tokens to verify (speculate.py)."""
        buckets = list(batch)
        samplers = [s for bucket in buckets for s in bucket.samplers]
        masks = masks_beside(grammar_rows(samplers), self.logits_width)
        drafts = speculate.drafts(buckets, seqs, self.speculative_tokens, self.speculative_max_rows,
                                  self.draft if self.speculative_method == "draft" else None)
        blocks = [bucket.next_block(self.pad_token_id, drafts) for bucket in buckets]
        started = time.perf_counter()
        logits = self._forward(blocks, every=bool(drafts))
        cost = self.step_cost
        if cost is not None:
            cost.add(sum(block.ids.numel() for block in blocks), time.perf_counter() - started)
        if masks is not None:
            masks.result()
        if drafts:
            sampled = speculate.verify(logits, blocks, buckets, drafts, samplers, self.speculative_tokens)
        else:
            sampled, start = sample(logits, samplers, cost.width if cost is not None else None), 0
            for bucket, block in zip(buckets, blocks, strict=True):
                bucket.advance(block, sampled.tokens[start : (start := start + len(bucket.ids))])
        return sampled  # in the batch's order, as seqs are (Engine.step answers in the plan's)

    def _forward(self, blocks: list[ragged.Block], every: bool = False) -> torch.Tensor:
        """The model over ``blocks``: logits of each row's last column, block after block
        (``[rows, vocab]``), or with ``every`` of every column (``[tokens, vocab]``). One forward
        (``ragged.forward``) where the model allows it; else one per block."""
        if self._ragged:
            return ragged.forward(self.model, blocks, every)
        logits = []
        for block in blocks:
            out = self.model(input_ids=block.ids, attention_mask=block.mask, position_ids=block.positions,
                             cache=block.cache, use_cache=True, logits_to_keep=0 if every else 1)
            logits.append(out.logits.flatten(0, 1))
        return torch.cat(logits)

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
