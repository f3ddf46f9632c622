"""How many characters of text one token can stand for: the bound that lets the service
refuse a prompt too long to fit before it spends any time tokenizing it."""

from __future__ import annotations

import json

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
