"""A request that runs on an upstream server, as the upstream's admission tracks it: a
``Sequence`` whose text arrives whole from the upstream (which tokenizes, applies stop sequences
and ``max_tokens`` itself) and whose token counts are the upstream's own once it reports them.
"""

from __future__ import annotations

from ..values.sequence import Sequence


class UpstreamSequence(Sequence):
    """``prompt_tokens`` is an estimate until the upstream reports its usage."""

    upstream_tokens: int | None = None  # tokens the upstream generated for it (chunks, then its usage)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids) if self.upstream_tokens is None else self.upstream_tokens

    def receive(self, text: str, now: float) -> str:
        """Text the upstream generated (one streamed chunk, usually one token). Returns the text."""
        if self.record.first_token_at is None:
            self.record.first_token_at = now
        self.upstream_tokens = (self.upstream_tokens or 0) + 1
        self.text += text
        return text

    def report_usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The upstream's own counts (its usage chunk) replace the estimates."""
        if prompt_tokens is not None:
            self.record.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.upstream_tokens = completion_tokens
