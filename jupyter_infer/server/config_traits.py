"""``InferApp``'s traits for the service's knobs, made from ``ServiceConfig``'s fields: a knob is
declared once (``values/config.py``: type, default, help) and is ``c.InferApp.<name>``,
``--InferApp.<name>=`` and a line of ``--help-all`` from there."""

from __future__ import annotations

from dataclasses import Field, fields

from traitlets import Bool, Dict, Float, HasTraits, Int, List, MetaHasTraits, TraitType, Unicode

from ..values.config import ServiceConfig

_SCALARS: dict[str, type[TraitType]] = {"str": Unicode, "int": Int, "float": Float, "bool": Bool}


def trait_of(knob: Field) -> TraitType:
    """The configurable trait of one ``ServiceConfig`` field, by its annotation."""
    kind, help_text = knob.type, knob.metadata["help"]
    default = ServiceConfig.default(knob.name)
    if kind in _SCALARS:
        trait = _SCALARS[kind](default, help=help_text)
    elif kind == "int | None":
        trait = Int(default, allow_none=True, help=help_text)
    elif kind.startswith("tuple["):  # tuple[float, float], tuple[str, ...]: a list of that scalar
        element = kind.removeprefix("tuple[").split(",")[0].strip(" ]")
        trait = List(_SCALARS[element](), default_value=list(default), help=help_text)
    elif kind.startswith("Mapping["):
        trait = Dict(default_value=dict(default), help=help_text)
    else:
        raise TypeError(f"ServiceConfig.{knob.name}: no trait for {kind!r}")
    return trait.tag(config=True)


# A class of its own (before ExtensionApp in InferApp's bases): the traits are configured as
# InferApp's, since a config section is named after a Configurable class of the instance.
ServiceTraits = MetaHasTraits("ServiceTraits", (HasTraits,),
                              {"__doc__": "One trait per ServiceConfig knob.",
                               **{f.name: trait_of(f) for f in fields(ServiceConfig)}})
