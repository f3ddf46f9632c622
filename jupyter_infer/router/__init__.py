"""``engine = "router"``: several named backends and a rule that picks one per request
(the model it names, then sensitivity, complexity or a callable, then the default), with a
fallback when the chosen backend fails before its first token."""

from .rule import Decision, Rule
from .service import RouterService

__all__ = ["Decision", "Rule", "RouterService"]
