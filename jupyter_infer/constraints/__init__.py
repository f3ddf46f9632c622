"""Structured outputs: what a request constrains its answer to (``spec``), the grammar that
enforces it inside the batch (``grammar``: compiled once per spec, a matcher per row), and the
tool-call format built on it (``tools``)."""

from ..values.request import Constraint, ConstraintKind

__all__ = ["Constraint", "ConstraintKind"]
