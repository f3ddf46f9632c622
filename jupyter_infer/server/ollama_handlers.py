"""Ollama's API under ``<base_url>infer/api/`` (issue 56, item 3)."""

from __future__ import annotations

ROUTES: list[tuple[str, type]] = []  # filled as the dialect is built
