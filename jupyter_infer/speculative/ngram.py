"""Draft tokens without a draft model: prompt lookup (n-gram speculation).

A row's next tokens are guessed by finding the last place its latest ``n`` tokens occurred
before, in its prompt or its answer so far, and proposing what followed them there
(transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram`` method, llama.cpp's
``ngram-simple``). Answers that quote their prompt (a tool result summarized, code being
edited, fields extracted from a document) and JSON whose keys repeat are where it pays; a row
with no match proposes nothing and pays nothing. The engine verifies the guesses in one
forward (``acceptance``): a greedy row keeps the longest prefix its model agrees with,
plus the model's own next token, so its output is what it would have been without drafts.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

MAX_N = 4  # the longest suffix matched first: a longer match is likelier to go on the same way
MIN_N = 2  # one token alone matches too often to predict anything


def propose(tokens: Seq[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of ``tokens``' last
    ``n`` tokens (``n`` from ``max_n`` down to ``min_n``); ``[]`` when none occurs."""
    length = len(tokens)
    if k <= 0 or length <= min_n:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = list(tokens[length - n :])
        last = tail[-1]
        # The latest start i < length - n with tokens[i:i + n] == tail, found from its last
        # token backwards (a Python loop over the history: ~0.1 ms for 2,000 tokens).
        for end in range(length - 2, n - 2, -1):
            if tokens[end] == last and list(tokens[end - n + 1 : end + 1]) == tail:
                # What followed, and past the history's end what the guess itself repeats: a
                # match one period back in a repeating run guesses the run's next periods.
                follow: list[int] = []
                for at in range(end + 1, end + 1 + k):
                    follow.append(tokens[at] if at < length else follow[at - length])
                return follow
    return []
