"""Grammars from constraints, and the per-row state that masks a row's logits: the one module
that knows the grammar library (llguidance; docs/structured-outputs.md says why it won).

``GrammarCompiler`` turns a ``Constraint`` into a ``Grammar`` once per (kind, spec) (a small
LRU cache): compiling drops the GIL, so the loop runs it on a worker thread with a time
limit. Each constrained row gets its own ``GrammarRow`` (a copy of the compiled matcher),
which the engine's ``RowSampler`` holds as a logits processor: ``mask`` keeps the tokens
the grammar allows (EOS once it is complete), ``advance`` consumes the chosen ones, and
``forced`` names the tokens the grammar allows no alternative to (fast-forward).
``compute_masks`` fills the masks of many rows at once, in parallel and off the GIL, so
the engine runs it while the model's forward runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..errors import InvalidRequest
from ..values.request import brief
from .spec import Constraint, seconds_below_60

log = logging.getLogger(__name__)
CACHE_SIZE = 256  # compiled grammars kept (by kind and spec)
FORCED_PER_STEP = 32  # forced tokens a row appends in one step (the rest come in the next ones)
# Compact JSON (no free whitespace): fewer tokens, and a random model cannot pad forever.
JSON_OPTIONS = {"whitespace_flexible": False}
# Bounds on the work one grammar may cost (llguidance's own fuel), below its defaults so
# that a hostile grammar is refused rather than slowing every step of its batch.
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
              max_grammar_size=500_000, verbose_errors=False)


# A reasoning model's <think> section before a constrained answer: any text without
# "</think>", then the answer. PARTIAL lets the section hold a tag's beginning ("</t x"):
# llguidance's lexer never backtracks, so a lone "<" lexeme would commit to "</think>".
# A few newlines may follow the section (Qwen3 writes two; the reasoning splitter drops them),
# not a random model's endless run of them.
_REASONING = {
    "may": "start: think? WS? @answer\nthink: \"<think>\" thought\n",
    "open": "start: thought WS? @answer\n",
}
_THOUGHT = ('thought: (PLAIN | PARTIAL)* "</think>"\nPLAIN: /[^<]+/\n'
            'PARTIAL: /<(\\/(t(h(i(nk?)?)?)?)?)?/\nWS: /\\n{1,3}/')


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint, after a reasoning section where it says so."""
    text = _answer_grammar(constraint)
    if not constraint.after_reasoning:
        return text
    # A Lark text as it stands (grammar_from_lark gives it back unwrapped), or the library's JSON.
    answer = json.loads(text)["grammars"] if text.startswith("{") else [{"lark_grammar": text}]
    start = {"lark_grammar": _REASONING[constraint.after_reasoning] + _THOUGHT}
    return json.dumps({"grammars": [start, {**answer[0], "name": "answer"}, *answer[1:]]})


def _answer_grammar(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (tools: ``tools.py`` has built it already)."""
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(seconds_below_60(json.loads(spec)),
                                                             defaults=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(spec))
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if kind == "grammar":
        lark = gbnf_to_lark(spec) if "::=" in spec else spec  # GBNF (llama.cpp's, vLLM's) or Lark
        return llguidance.LLMatcher.grammar_from_lark(lark)
    if kind == "tools":  # the set itself rides on its constraint (spec.ToolsConstraint)
        return llguidance.LLMatcher.grammar_from_lark(constraint.tools.lark())
    raise ValueError(f"unknown constraint kind {kind!r}")


class Grammar:
    """A compiled grammar: a matcher in its start state, copied for every row that uses it."""

    def __init__(self, matcher: llguidance.LLMatcher, constraint: Constraint, compiler: GrammarCompiler) -> None:
        self._matcher = matcher
        self.constraint = constraint
        self._compiler = compiler

    def row(self) -> GrammarRow:
        return GrammarRow(self._matcher.deep_copy(), forwarding=self._compiler.fast_forward)


class GrammarCompiler:
    """Compiles constraints for one tokenizer (``hf``: a transformers fast tokenizer; or
    ``tokens``: each id's bytes, for the simulated engine). ``vocab`` is the logits' width."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab: int) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self._cache: OrderedDict[tuple[str, str, str], Grammar] = OrderedDict()
        self._lock = threading.Lock()  # compiles run on worker threads
        self.compiled = 0
        self.fast_forward = True  # rows append their grammar's forced tokens (InferApp.grammar_fast_forward)
        self._compile_ms: deque[float] = deque(maxlen=1000)  # the recent compiles' times

    @classmethod
    def for_hf(cls, hf_tokenizer: Any, vocab: int, eos_ids: Seq[int]) -> GrammarCompiler:
        import llguidance.hf

        text_ids = {i for i, added in getattr(hf_tokenizer, "added_tokens_decoder", {}).items()
                    if not added.special and i < vocab}
        # Where added tokens become text, this first tokenizer only lends its token bytes and
        # is dropped: no slices (llguidance's precomputed token sets, ~40 MB and 0.1 s for a
        # 152k vocabulary), which only the kept one uses.
        tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab, eos_token=sorted(eos_ids),
                                                 slices=[] if text_ids else None)
        if text_ids:
            tokenizer = _added_tokens_as_text(tokenizer, hf_tokenizer, vocab, sorted(eos_ids), text_ids)
        return cls(tokenizer, vocab)

    @classmethod
    def for_tokens(cls, tokens: Seq[bytes], encode: Any, eos_id: int) -> GrammarCompiler:
        """A tokenizer given as each id's bytes and an ``encode(bytes) -> ids``."""

        class _Tokens:  # what llguidance's TokenizerWrapper reads
            eos_token_id, bos_token_id = eos_id, None

            def __init__(self) -> None:
                self.tokens = list(tokens)

            def __call__(self, data: bytes) -> list[int]:
                return encode(data)

        wrapper = llguidance.TokenizerWrapper(_Tokens())
        return cls(llguidance.LLTokenizer(wrapper, n_vocab=len(tokens)), len(tokens))

    def cached(self, constraint: Constraint) -> Grammar | None:
        """The grammar of ``constraint`` if it is compiled already (``None``: compile it)."""
        with self._lock:
            grammar = self._cache.get((constraint.kind, constraint.spec, constraint.after_reasoning))
            if grammar is not None:
                self._cache.move_to_end((constraint.kind, constraint.spec, constraint.after_reasoning))
            return grammar

    def compile(self, constraint: Constraint) -> Grammar:
        """The grammar of ``constraint`` (cached); ``InvalidRequest`` naming the constraint's
        field when it does not compile. Runs the library's compiler (GIL released)."""
        key = (constraint.kind, constraint.spec, constraint.after_reasoning)
        grammar = self.cached(constraint)
        if grammar is not None:
            return grammar
        try:
            text = grammar_text(constraint)
        except Exception as err:  # a GBNF that does not convert, a schema too deep to walk: the request's fault
            raise InvalidRequest(f"The {constraint.describe()} constraint is not valid: {_first_line(str(err))}.",
                                 param=constraint.param) from None
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=llguidance.LLParserLimits(**LIMITS))
        self._compile_ms.append((time.perf_counter() - started) * 1000)
        problem = _first_line(matcher.get_error()) if matcher.is_error() else self._dead_end(matcher)
        if problem is not None:
            raise InvalidRequest(f"The {constraint.describe()} constraint cannot be enforced: {problem}",
                                 param=constraint.param)
        grammar = Grammar(matcher, constraint, self)
        with self._lock:
            self._cache[key] = grammar
            self.compiled += 1
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def _dead_end(self, matcher: llguidance.LLMatcher) -> str | None:
        """Why no answer can fit, where that shows once the grammar's fixed start is taken (a
        rule with no way out after a forced ``a``): refused now, with a 400, instead of
        failing mid-answer (a streamed answer would have sent its 200 already)."""
        probe = matcher.deep_copy()
        forced = list(probe.compute_ff_tokens())[:256]
        if forced:
            probe.consume_tokens(forced)
        if probe.is_error():
            return _first_line(probe.get_error())
        if probe.is_stopped():
            return None
        bits = np.empty((self.vocab + 31) // 32, dtype=np.int32)
        probe.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if probe.is_error() or not bits.any():
            return "it allows no answer (after its fixed start, no token can follow)."
        return None

    def stats(self) -> dict[str, Any]:
        """Compiles so far, grammars cached, and the recent compile times (ms)."""
        times = sorted(self._compile_ms)

        def at(q: float) -> float | None:
            return round(times[min(len(times) - 1, int(q * len(times)))], 3) if times else None

        return {"compiled": self.compiled, "cached": len(self._cache), "compile_ms_p50": at(0.5),
                "compile_ms_p99": at(0.99), "compile_ms_max": round(times[-1], 3) if times else None,
                "fast_forward": self.fast_forward}


def _added_tokens_as_text(tokenizer: llguidance.LLTokenizer, hf_tokenizer: Any, vocab: int, eos_ids: list[int],
                          text_ids: set[int]) -> llguidance.LLTokenizer:
    """``tokenizer`` with the checkpoint's added tokens that are not special (Qwen's
    ``<tool_call>``, ``<think>``) as the text they stand for. llguidance takes every added token
    for a special one, yet its masks allow them where their text fits and the model's tokenizer
    turns forced text into them: consuming one then fails the row ("token <think>[151667]
    doesn't satisfy the grammar"). A grammar can still name one by id (``<[151667]>``)."""
    tokens = [tokenizer.decode_bytes([i]) for i in range(vocab)]
    special = [i for i in range(vocab) if tokenizer.is_special_token(i) and i not in text_ids]

    class _Tokens:  # what llguidance's TokenizerWrapper reads
        eos_token_id, bos_token_id = eos_ids[0] if eos_ids else None, None
        special_token_ids = special

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, data: bytes) -> list[int]:
            return hf_tokenizer.encode(data.decode("utf-8", errors="replace"), add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokens()), n_vocab=vocab, eos_token=eos_ids)


def _first_line(message: str) -> str:
    return brief(message) or "the grammar library refused it"


class GrammarRow:
    """One row's grammar state, a logits processor (``logits_processors.LogitsProcessor``).
    ``mask`` uses the mask ``compute_masks`` filled for this step, or computes it."""

    spent = False  # a grammar masks every token of the row, to its end

    def __init__(self, matcher: llguidance.LLMatcher, *, forwarding: bool = True) -> None:
        self.matcher = matcher
        self.forwarding = forwarding  # fast-forward on (InferApp.grammar_fast_forward)
        self._bits: np.ndarray | None = None  # this step's mask, packed (int32 words)
        self.tokens = 0  # tokens consumed so far

    @property
    def error(self) -> str | None:
        return _first_line(self.matcher.get_error()) if self.matcher.is_error() else None

    @property
    def done(self) -> bool:
        """Complete: only EOS may follow."""
        return self.matcher.is_stopped()

    def fill(self, words: int) -> None:
        bits = np.empty(words, dtype=np.int32)
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        self._bits = bits

    def allowed(self, vocab: int) -> np.ndarray:
        """The tokens the grammar allows next (a bool array of ``vocab``)."""
        if self._bits is None:
            self.fill((vocab + 31) // 32)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:vocab].astype(bool)

    def mask(self, logits: Any) -> Any:
        """Disallowed tokens to -inf in one row of logits (a torch tensor; torch is the
        engine's, imported here only when a row is masked, so the service loads without it)."""
        import torch

        allowed = torch.from_numpy(self.allowed(logits.shape[-1])).to(logits.device)
        return logits.masked_fill_(~allowed, float("-inf"))

    def advance(self, tokens: Seq[int]) -> None:
        self._bits = None
        for token in tokens:
            if not self.matcher.consume_token(token):
                log.warning("jupyter_infer: a grammar refused a token it had allowed: %s", self.error)
                return
        self.tokens += len(tokens)

    def forced(self) -> list[int]:
        """Tokens the grammar allows no alternative to, from here (fast-forward), at most
        ``FORCED_PER_STEP``: a long forced run (a long ``const``) is fed over several steps,
        as a long prompt is chunked, not in one wide step that stalls the batch."""
        if not self.forwarding or self.matcher.is_stopped() or self.matcher.is_error():
            return []
        run = list(self.matcher.compute_ff_tokens())[:FORCED_PER_STEP]
        # The forced bytes are tokenized by the model's tokenizer: only the part of the run
        # the matcher accepts is forced (a token it takes for a special one would fail the row;
        # see _added_tokens_as_text), the row samples the rest.
        return run[: self.matcher.validate_tokens(run)] if run else run

    def fast_forward(self, eos: int | None, run: list[int] | None = None) -> list[int]:
        """The tokens that follow the row's chosen one without sampling, consumed: the forced
        run (or ``run``, a beginning of it), then ``eos`` once the grammar is complete (so the
        row spends no step on either)."""
        run = self.forced() if run is None else list(run)
        self.advance(run)
        if self.forwarding and eos is not None and self.done:
            run.append(eos)
        return run


_executor: llguidance.LLExecutor | None = None


def compute_masks(rows: Seq[GrammarRow], vocab: int) -> None:
    """Fill the masks of ``rows`` for this step, in parallel on llguidance's threads (the GIL
    is released: the engine runs this beside the model's forward)."""
    global _executor
    if not rows:
        return
    if _executor is None:
        _executor = llguidance.LLExecutor(num_threads=2)
    words = (vocab + 31) // 32
    bits = np.empty((len(rows), words), dtype=np.int32)
    _executor.unsafe_compute_mask_ptr([(r.matcher, i) for i, r in enumerate(rows)], bits.ctypes.data,
                                      words * 4, len(rows))
    for i, row in enumerate(rows):
        row._bits = bits[i]


_beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jupyter-infer-masks")


def masks_beside(rows: Seq[GrammarRow], vocab: int) -> Future | None:
    """Start filling the masks of ``rows`` on a worker thread (``None``: no row has a
    grammar, nothing to wait for); the caller runs its forward meanwhile and waits on the
    future before sampling."""
    return _beside.submit(compute_masks, list(rows), vocab) if rows else None


_compiling = ThreadPoolExecutor(max_workers=2, thread_name_prefix="jupyter-infer-grammar")
_in_flight: dict[tuple[int, str, str], asyncio.Future] = {}  # compiles running, by compiler and spec


async def compile_in_time(compiler: GrammarCompiler, constraint: Constraint, timeout: float) -> Grammar:
    """``compiler.compile(constraint)`` on a worker thread, never on the event loop; a 400
    when it takes longer than ``timeout`` seconds (its thread finishes on its own, bounded
    by the library's fuel limits, and the result is cached for the next request)."""
    cached = compiler.cached(constraint)
    if cached is not None:  # no thread hop for a grammar compiled already
        return cached
    key = (id(compiler), constraint.kind, constraint.spec)
    future = _in_flight.get(key)
    if future is None:  # a burst of one new spec compiles it once
        future = asyncio.get_running_loop().run_in_executor(_compiling, compiler.compile, constraint)
        _in_flight[key] = future
        future.add_done_callback(lambda _: _in_flight.pop(key, None))
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except asyncio.TimeoutError:
        raise InvalidRequest(
            f"The {constraint.describe()} constraint did not compile within {timeout:g} s "
            "(InferApp.grammar_timeout_s); simplify it.", param=constraint.param) from None
