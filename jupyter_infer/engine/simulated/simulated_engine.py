"""The offline engine: deterministic answers about AI concepts, at a realistic token rate.

It batches like the real engine: a prefill step costs time that grows with the prompt
tokens of the newcomers, and a decode step costs one per-token delay (10–40 ms, from a seeded
RNG) for the whole batch, so batching many requests is as much a win here as on a GPU;
newcomers arriving while rows decode ride in their step (a mixed step), their prompt tokens
adding their time to it.

Of the sampling parameters it honours what a scripted answer can: ``max_tokens``, ``stop``,
``seed`` (which answer), ``min_tokens`` and ``ignore_eos`` (the answer starts over instead
of ending). Temperature, top-k/p, penalties and ``logit_bias`` do not change a scripted
answer. A chat that offers tools gets a call when its user names one (``calls``).
Log probabilities are deterministic stand-ins with the right shapes: the chosen token is
always the most likely, with logprob ``-0.1 * (1 + id % 10)``; the ``k - 1`` alternatives
after it are the next token ids, each 1.0 less likely; a prompt's first token has none.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...constraints.grammar import GrammarCompiler, GrammarRow
from ...values.engine_info import EngineInfo
from ...values.request import TokenLogprob
from ..base import Engine, RowOutput, RowTable, Sampled
from .answers import compose_answer
from .calls import asked, simulated_turn
from .knowledge_tokenizer import EOS_ID, SimulatedText

if TYPE_CHECKING:
    from ...values.step import RowRequest


SIMULATED_RUN = 12  # answer tokens a constrained row reads into one string (or text) before closing it


@dataclass(eq=False)
class SimulatedRow:
    """One running row: the token ids of the answer it reads out and, for a constrained row,
    its grammar state and how far into its answer it has read."""

    id: str
    answer: list[int]
    grammar: GrammarRow | None = None
    read: int = 0
    run: int = 0  # answer tokens taken since a constrained row last closed
    whole: bool = False  # a call, or a text beside tools: read all of it


@dataclass
class SimulatedBatch:
    """The running rows, in order."""

    rows: list[SimulatedRow]

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.rows]

    def filter(self, ids: list[str]) -> SimulatedBatch | None:
        if not ids:
            return None
        by_id = {r.id: r for r in self.rows}
        self.rows = [by_id[i] for i in ids]
        return self

    def take(self, ids: list[str]) -> SimulatedBatch:
        by_id = {r.id: r for r in self.rows}
        return SimulatedBatch([by_id[i] for i in ids])

    def concatenate(self, other: SimulatedBatch) -> SimulatedBatch:
        return SimulatedBatch(self.rows + other.rows)


@dataclass
class PartialPrompt:
    """A prompt part-way through a chunked prefill: the tokens done."""

    done: int


class SimulatedEngine(Engine):
    mixes_steps = True  # newcomers' prompt tokens ride in the decoding rows' step (``mixed``)
    rows: RowTable[SimulatedBatch, PartialPrompt]

    def __init__(
        self,
        *,
        seed: int = 0,
        token_delay_ms: tuple[float, float] = (10.0, 40.0),
        prefill_ms_per_token: float = 0.2,
        prefill_base_ms: float = 5.0,
        # What the models users serve read (32k): an agent's system prompt and tools fit
        # (Jupyternaut's are ~14k of these tokens).
        max_context: int = 32768,
        fallback_reason: str | None = None,
    ) -> None:
        super().__init__()
        self.info = EngineInfo(
            engine="simulated",
            model="simulated",
            device="cpu",
            dtype="n/a",
            max_context=max_context,
            fallback_reason=fallback_reason,
        )
        self.prefill_chunk_tokens = 64
        self.token_delay_ms = token_delay_ms
        self.prefill_ms_per_token = prefill_ms_per_token
        self.prefill_base_ms = prefill_base_ms
        self._rng = random.Random(seed)
        self.text = SimulatedText()
        tokenizer = self.text.tokenizer
        self.grammars = GrammarCompiler.for_tokens(
            tokenizer.token_bytes(), lambda data: tokenizer.tokenize(data.decode("utf-8", "replace")), EOS_ID)
        # A constrained row that cannot read on in its answer closes what it opened.
        self._closers = [EOS_ID, *(tokenizer.tokenize(c)[0] for c in ('"', "}", "]"))]

    @property
    def vocab_size(self) -> int:
        return self.text.tokenizer.vocab_size

    def prefill(self, seqs: list[RowRequest], num_scheduled: list[int]) -> Sampled:
        """Prompts cost time by their tokens; a prompt's first token comes once all of it is
        in (a chunked one over several steps, ``rows.prefilling`` says how far each got)."""
        partial = self.rows.prefilling
        done = [partial[s.id].done if s.id in partial else 0 for s in seqs]
        ends = [min(len(s.prompt_ids), d + n) for s, d, n in zip(seqs, done, num_scheduled, strict=True)]
        self.spend_ms(self.prefill_base_ms + self.prefill_ms_per_token * (sum(ends) - sum(done)))
        complete = [e == len(s.prompt_ids) for s, e in zip(seqs, ends, strict=True)]
        if any(complete) and not all(complete):
            raise RuntimeError("the scheduler chunks a long prompt alone")
        for s, end in zip(seqs, ends, strict=True):
            partial.pop(s.id, None)
            if end < len(s.prompt_ids):
                partial[s.id] = PartialPrompt(end)
        if not any(complete):
            return [RowOutput(computed=end) for end in ends]
        return self._start(seqs)

    embeds = True
    EMBEDDING_SIZE = 64

    def embed(self, rows: list[RowRequest]) -> list[list[float]]:
        """A bag of the prompt's lower-cased words, hashed into 64 dimensions (the same text,
        the same vector; texts that share words lie close), normalized; its prompt's time spent."""
        self.spend_ms(self.prefill_base_ms + self.prefill_ms_per_token * sum(len(r.prompt_ids) for r in rows))
        vectors = []
        for row in rows:
            vector = [0.0] * self.EMBEDDING_SIZE
            for word in re.findall(r"\w+", row.request.prompt.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                vector[int.from_bytes(digest, "little") % self.EMBEDDING_SIZE] += 1.0
            norm = math.sqrt(sum(v * v for v in vector)) or 1.0
            vectors.append([v / norm for v in vector])
        return vectors

    def answer(self, seq: RowRequest) -> list[int]:
        """The tokens a prefilled ``seq`` reads out: its composed answer, or the tool call it
        makes (``calls``)."""
        call, _ = simulated_turn(seq.request)
        return self.text.tokenize(call or compose_answer(asked(seq.request), self._seed_for(seq)))

    def _start(self, seqs: list[RowRequest]) -> Sampled:
        """The rows of prefilled ``seqs`` join the decoding rows; their first tokens."""
        rows = [SimulatedRow(s.id, self.answer(s), s.grammar.row() if s.grammar is not None else None,
                             whole=simulated_turn(s.request)[1]) for s in seqs]
        sampled = self._sampled(self._tokens(rows, seqs), seqs, rows)
        for output, s in zip(sampled, seqs, strict=True):
            if s.params.prompt_logprobs is not None:
                output.prompt_logprobs = [None, *(self._stand_in(t, s.params.prompt_logprobs)
                                                  for t in s.prompt_ids[1:])]
        self.rows.join(SimulatedBatch(rows))
        return sampled

    def mixed(
        self, decoding: list[RowRequest], seqs: list[RowRequest], num_scheduled: list[int],
        guesses: dict[str, int] | None = None,
    ) -> Sampled:
        """The decoding rows' step with newcomers' prompt tokens in it, as one forward costs:
        a token's delay and each prompt token's time (not a prefill's fixed cost again)."""
        decoded = self.decode(decoding)
        # Through ``prefill`` itself (tests' scripted engines override it), its fixed cost off.
        fixed, self.prefill_base_ms = self.prefill_base_ms, 0.0
        try:
            return decoded + self.prefill(seqs, num_scheduled)
        finally:
            self.prefill_base_ms = fixed

    def decode(self, seqs: list[RowRequest], guesses: dict[str, int] | None = None) -> Sampled:
        self.spend_ms(self._rng.uniform(*self.token_delay_ms))
        rows = self.rows.decoding.rows
        return self._sampled(self._tokens(rows, seqs), seqs, rows)

    def _tokens(self, rows: list[SimulatedRow], seqs: list[RowRequest]) -> list[list[int]]:
        """Each row's tokens this step: its answer's next, or a constrained row's choice and
        the tokens its grammar forces after it (then EOS once it is complete)."""
        tokens = []
        for row, seq in zip(rows, seqs, strict=True):
            grammar = row.grammar
            if grammar is None:
                tokens.append([_next(row.answer, len(seq.output_ids), seq)])
                continue
            chosen = [self._allowed_next(grammar, row)]
            grammar.advance(chosen)
            if seq.params.logprobs is None:
                forced = grammar.fast_forward(EOS_ID)
                chosen += forced
                if row.whole and row.answer[row.read : row.read + len(forced)] == forced:
                    row.read += len(forced)  # a call reads on past what its grammar wrote
            tokens.append(chosen)
        return tokens

    def _allowed_next(self, grammar: GrammarRow, row: SimulatedRow) -> int:
        """A constrained row's token: its answer's next one where the grammar allows it (at
        most ``SIMULATED_RUN`` in a row: a string or a text stays short), else the first closer
        (EOS, a quote, a brace, a bracket) it allows, else the lowest id."""
        allowed = grammar.allowed(self.vocab_size)
        answer, read = row.answer, row.read
        if read < len(answer) and allowed[answer[read]] and (row.whole or row.run < SIMULATED_RUN):
            row.read += 1
            row.run += 1
            return answer[read]
        for token in self._closers:
            if allowed[token]:
                row.run = 0
                return token
        return int(np.flatnonzero(allowed)[0]) if allowed.any() else EOS_ID

    def _sampled(self, tokens: list[list[int]], seqs: list[RowRequest], rows: list[SimulatedRow]) -> Sampled:
        out = []
        for chosen, seq, row in zip(tokens, seqs, rows, strict=True):
            k = seq.params.logprobs
            out.append(RowOutput(
                chosen, None if k is None else [self._stand_in(t, k) for t in chosen],
                error=row.grammar.error if row.grammar is not None else None,
                forced=len(chosen) - 1,  # only a grammar's forced run gives a row several
            ))
        return out

    def _stand_in(self, token: int, k: int) -> TokenLogprob:
        """The documented deterministic logprob of ``token`` and ``k`` alternatives."""
        logprob = -0.1 * (1 + token % 10)
        vocab = max(self.vocab_size, 1)
        top = tuple(((token + j) % vocab, logprob - j) for j in range(min(k, vocab)))
        return TokenLogprob(token, logprob, top)

    def _seed_for(self, seq: RowRequest) -> int:
        if seq.params.seed is not None:
            return seq.params.seed
        if seq.params.greedy:
            return 0  # greedy: one answer per prompt
        return self._rng.randrange(2**31)

    @staticmethod
    def spend_ms(ms: float) -> None:
        """Wait out ``ms`` of simulated compute: where every step's cost becomes time (a test
        may replace it to read the costs instead)."""
        if ms > 0:
            time.sleep(ms / 1000.0)


def _next(answer: list[int], position: int, seq: RowRequest) -> int:
    """The answer's token at ``position``; past its end EOS, or the answer again from its
    start while the request must go on (``ignore_eos``, ``min_tokens``)."""
    if position < len(answer):
        return answer[position]
    if answer and (seq.params.ignore_eos or position < seq.params.min_tokens):
        return answer[position % len(answer)]
    return EOS_ID
