"""Tokens per minute, per owner (``InferApp.owner_tokens_per_minute``).

A request reserves what it may cost when it is queued (its prompt's tokens and its
``max_tokens``), as OpenAI's rate limits count it, so a burst cannot overdraw the minute by
asking for long answers; when it ends, the reservation becomes what it really cost. A
request that would pass the budget is refused with 429 and a ``Retry-After`` of when enough
of the last minute's tokens will have aged out.
"""

from __future__ import annotations

from collections import deque

from ..errors import QueueFull

WINDOW_S = 60.0


class RateLimited(QueueFull):
    code = "rate_limited"


class OwnerBudget:
    def __init__(self, tokens_per_minute: int) -> None:
        self.limit = tokens_per_minute  # 0: no limit
        self._spent: dict[str, deque[list]] = {}  # owner -> [at, tokens, request id], oldest first
        self._entries: dict[str, list] = {}  # request id -> its entry, until it ends

    def reserve(self, owner: str, request_id: str, tokens: int, now: float) -> None:
        """Count ``tokens`` for ``owner`` now, or raise ``RateLimited`` (counting nothing)."""
        if not self.limit:
            return
        spent = self._spent.setdefault(owner, deque())
        while spent and spent[0][0] <= now - WINDOW_S:
            self._entries.pop(spent.popleft()[2], None)
        used = sum(entry[1] for entry in spent)
        if used + tokens > self.limit:
            freed, wait = used, 1.0
            for at, cost, _ in spent:  # the oldest go first: when enough have
                freed -= cost
                wait = at + WINDOW_S - now
                if freed + tokens <= self.limit:
                    break
            if tokens > self.limit:
                message = (f"This request may cost {tokens} tokens (its prompt and max_tokens), more than the "
                           f"{self.limit} tokens per minute each user has here (InferApp.owner_tokens_per_minute): "
                           "ask for fewer max_tokens or send a shorter prompt.")
            else:
                message = (f"You have used {used} of your {self.limit} tokens per minute "
                           f"(InferApp.owner_tokens_per_minute; a request counts its prompt and max_tokens "
                           f"until it ends); this one may cost {tokens}. Retry in {max(1, round(wait))} s.")
            raise RateLimited(message, retry_after=max(1.0, wait))
        entry = [now, tokens, request_id]
        spent.append(entry)
        self._entries[request_id] = entry

    def settle(self, request_id: str, tokens: int) -> None:
        """A request ended: it cost ``tokens`` (prompt processed and tokens generated)."""
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            entry[1] = min(entry[1], tokens)
