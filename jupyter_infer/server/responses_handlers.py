"""OpenAI's Responses API under ``<base_url>infer/v1/responses`` (issue 56, item 1)."""

from __future__ import annotations

ROUTES: list[tuple[str, type]] = []  # filled as the dialect is built
