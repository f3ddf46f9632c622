"""The simulated engine's tokenizer: a fixed vocabulary with a byte fallback, like byte-level BPE.

Text is cut into word-ish pieces the way GPT-2 pre-tokenizes (a word or punctuation mark takes
the one space before it; other whitespace stands alone, up to and including a line break). A piece in the vocabulary (every word
and mark of the knowledge file, with and without a leading space) is one id, so the engine's own
answers cost one id per word; any other piece is spelled in ASCII letter pairs (one id per two
letters, about what a BPE spends on a word it has never seen) and, for the rest, UTF-8 bytes.
So the vocabulary never grows, whatever the prompts hold, and ``detokenize(tokenize(text))``
is ``text`` for every string, lone surrogates included.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterable, Sequence

from ...text.model_text import ModelText
from .answers import knowledge_texts

EOS_ID = 0
_FIRST_BYTE_ID = 1  # ids 1..256 are the bytes 0..255
_FIRST_PIECE_ID = _FIRST_BYTE_ID + 256

# GPT-2's pre-tokenizer, except that whitespace ending in a line break is one piece, so a CRLF
# never streams as two fragments (SSE would read each as a line break).
_PIECE = re.compile(r" ?[\w']+| ?[^\w\s]|\s*\n|\s+(?!\S)|\s+")
_SPELLING = re.compile(r" ?[A-Za-z]{1,2}|\r\n|[\s\S]")  # how an unknown piece is spelled
_FIELD = re.compile(r"\{\w+\}")  # template fields such as {t}: filled with labels, not said
_WHITESPACE = (" ", "  ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n")


class ByteFallbackTokenizer:
    """A fixed vocabulary built from ``texts``; other pieces are spelled in letter pairs and bytes."""

    def __init__(self, texts: Iterable[str]) -> None:
        pieces = set(_WHITESPACE)
        for a in string.ascii_letters:  # so an unknown word costs one id per two letters
            pieces.update(a + b for b in ("", *string.ascii_letters))
        pieces.update([" " + piece for piece in pieces if piece.strip()])
        for text in texts:
            for part in _FIELD.split(text):
                for piece in _PIECE.findall(part):
                    word = piece.removeprefix(" ")
                    if word.strip():
                        # A word can follow a space or open a sentence, a label or a line.
                        pieces.update((word, " " + word))
        self._pieces: list[str] = sorted(pieces)
        self._ids = {piece: _FIRST_PIECE_ID + i for i, piece in enumerate(self._pieces)}

    @property
    def vocab_size(self) -> int:
        return _FIRST_PIECE_ID + len(self._pieces)

    @property
    def longest_piece(self) -> int:
        """The most characters one id stands for (a spelled letter pair or byte is shorter)."""
        return max(map(len, self._pieces))

    def token_bytes(self) -> list[bytes]:
        """Each id's bytes (EOS: none), for a grammar library's view of the vocabulary."""
        return [b"", *(bytes([b]) for b in range(256)), *(p.encode() for p in self._pieces)]

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        known = self._ids.get
        for piece in _PIECE.findall(text):
            token = known(piece)
            if token is not None:
                ids.append(token)
                continue
            for chunk in _SPELLING.findall(piece):
                token = known(chunk)
                if token is not None:
                    ids.append(token)
                else:
                    ids.extend(_FIRST_BYTE_ID + b for b in chunk.encode("utf-8", "surrogatepass"))
        return ids

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (EOS dropped); a byte run cut inside a character ends in U+FFFD."""
        parts: list[str] = []
        spelled = bytearray()
        for token in token_ids:
            if _FIRST_BYTE_ID <= token < _FIRST_PIECE_ID:
                spelled.append(token - _FIRST_BYTE_ID)
                continue
            if spelled:
                parts.append(_decode(spelled))
                spelled.clear()
            if _FIRST_PIECE_ID <= token < self.vocab_size:
                parts.append(self._pieces[token - _FIRST_PIECE_ID])
            elif token != EOS_ID:
                raise ValueError(f"token id {token} is not in the vocabulary (0 to {self.vocab_size - 1})")
        if spelled:
            parts.append(_decode(spelled))
        return "".join(parts)


def _decode(spelled: bytearray) -> str:
    try:
        return spelled.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # a character still being spelled, or bytes that are not UTF-8
        return spelled.decode("utf-8", "replace")


@functools.cache
def knowledge_tokenizer() -> ByteFallbackTokenizer:
    """The one tokenizer every simulated engine shares: it is immutable, so threads may share it."""
    return ByteFallbackTokenizer(knowledge_texts())


class SimulatedText(ModelText):
    """The simulated engine's text side: the shared knowledge tokenizer, its own EOS (a bench
    may empty one engine's), no chat template (a chat is its ``role: content`` lines)."""

    def __init__(self) -> None:
        self.tokenizer = knowledge_tokenizer()  # fixed and shared: prompts cannot grow it
        self.eos_token_ids = frozenset({EOS_ID})
        self.max_token_chars = self.tokenizer.longest_piece

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.detokenize(token_ids)
