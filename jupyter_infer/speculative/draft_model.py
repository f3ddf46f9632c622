"""Draft tokens from a draft model: a smaller model with the target's tokenizer guesses a
row's next tokens, greedily, and the decode step verifies them (``acceptance``).

Each guessing row holds the draft model's own KV of its history (``DraftKV``, a one-row cache
in the engine's row: it goes where the row goes, and leaves with it): a step feeds the draft
model what the row got since its last guesses (the target's kept guesses and its own token),
after cutting the guesses it refused off that cache, then ``k - 1`` more tokens one at a time. Its guesses are greedy, so they are a
function of the row's history: the sure-draft rejection sampling that verifies n-gram
guesses keeps a sampled row's tokens exactly the target's distribution here too (a draft's
probabilities would raise acceptance, not exactness). The rows' draft runs are one after
another, not batched: speculation pays most with few rows (``speculative_max_rows``), and a
draft model worth running is ~10x cheaper than its target (vLLM's and llama.cpp's advice).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

from ..cpu.model_linears import swap_linears
from ..values.request import brief

# Tokens of a row's history the draft model catches up on in one step at most: a row new to it
# is prefilled into its cache over several steps rather than in one
# forward that would stall everyone's decode step, as a long prompt is prefilled in chunks.
CATCH_UP_TOKENS = 64


class KVCacheFunctions(Protocol):
    """The engine's KV cache functions (``engine/kv/kv_cache.py``, a floor above this one: the
    engine passes the module in), so that a draft row's cache grows, and is cut back past
    refused guesses, as the target's rows' caches do."""

    def new_cache(self, config: Any) -> DynamicCache: ...

    def reusable(self, config: Any) -> bool: ...

    def drop_columns(self, cache: DynamicCache, n: int) -> None: ...


@dataclass
class DraftKV:
    """The draft model's KV of one row's history."""

    cache: DynamicCache
    fed: list[int]  # the tokens whose KV the cache holds, in order


class DraftModel:
    """A causal LM that proposes draft tokens for the rows of a bigger one."""

    @classmethod
    def load(cls, name: str, *args, **kwargs) -> DraftModel:
        """``DraftModel(name, ...)``; a failure to load says it was the draft model that failed
        (and how to do without it), not the model."""
        try:
            return cls(name, *args, **kwargs)
        except Exception as err:
            if "InferApp.draft_model" in str(err):
                raise  # ours, which says what is wrong with it
            first = brief(str(err)) or type(err).__name__
            raise ValueError(f"InferApp.draft_model {name!r} could not be loaded ({type(err).__name__}: {first}): "
                             "give a directory or hub id of a model with the model's tokenizer, or set "
                             "InferApp.speculative = 'ngram'") from err

    def __init__(self, name: str, target_tokenizer: PreTrainedTokenizerBase, target_vocab: int, *,
                 kv: KVCacheFunctions, device: str, dtype: torch.dtype,
                 local_files_only: bool = False, prepack: bool = True) -> None:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
        if tokenizer.get_vocab() != target_tokenizer.get_vocab():
            raise ValueError(f"InferApp.draft_model {name!r} has another tokenizer than the model's: a draft "
                             "model must share its tokenizer (its token ids are the model's guesses)")
        self.model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_files_only)
        self.model = self.model.to(device).eval()
        config = self.model.config
        self.kv = kv
        if not kv.reusable(config):
            raise ValueError(f"InferApp.draft_model {name!r} has sliding-window layers: a draft model must "
                             "attend to its whole past (its cache is cut back to the tokens kept)")
        if int(config.vocab_size) > target_vocab:
            raise ValueError(f"InferApp.draft_model {name!r} has more logits ({config.vocab_size}) than the "
                             f"model ({target_vocab})")
        if device == "cpu":
            swap_linears(self.model, prepack=prepack)
        self.name, self.device = name, device
        self.max_context = int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))
        self.parameters = sum(p.numel() for p in self.model.parameters())

    def new_kv(self) -> DraftKV:
        """An empty history, for a row about to guess for the first time."""
        return DraftKV(self.kv.new_cache(self.model.config), [])

    @torch.inference_mode()
    def propose(self, row: DraftKV, tokens: Seq[int], k: int) -> list[int]:
        """Up to ``k`` greedy guesses after ``tokens`` (the row's prompt and answer so far),
        from ``row``, its KV so far (brought up to ``tokens`` here)."""
        if k <= 0 or len(tokens) + k > self.max_context:
            return []
        same = _common_prefix(row.fed, tokens)
        same = min(same, len(tokens) - 1)  # feed one token at least: its logits give the first guess
        if same < len(row.fed):  # the guesses its target refused, and what came after them
            self.kv.drop_columns(row.cache, len(row.fed) - same)
            del row.fed[same:]
        if len(tokens) - same > CATCH_UP_TOKENS:  # a chunk of its history this step, no guesses yet
            chunk = list(tokens[same : same + CATCH_UP_TOKENS])
            self.model(input_ids=torch.tensor([chunk], device=self.device), cache=row.cache, use_cache=True,
                       logits_to_keep=1)
            row.fed.extend(chunk)
            return []
        guesses, feed = [], list(tokens[same:])
        for _ in range(k):
            out = self.model(input_ids=torch.tensor([feed], device=self.device), cache=row.cache,
                             use_cache=True, logits_to_keep=1)
            row.fed.extend(feed)
            feed = [int(out.logits[0, -1].argmax())]
            guesses.extend(feed)
        return guesses


def _common_prefix(a: Seq[int], b: Seq[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
