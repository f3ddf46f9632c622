"""What a request constrains its answer to, read from the fields clients send.

One ``Constraint`` per request at most, from any of the spellings in use: OpenAI's
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs``
(``json``, ``regex``, ``choice``, ``grammar``) and its older ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, and this server's native
``json_schema``, ``regex``, ``choice``, ``grammar``. Tool calls (``tools.py``) are a
constraint too. A ``Constraint`` is a value (kind and text), so it can key a
compile cache and be sent on to an upstream server as the client sent it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidRequest
from ..values.request import Constraint, show

# A schema, grammar or tool list this long is refused before compiling. What bounds a
# constraint is the request body's size (InferApp.max_body_bytes, 1 MB) and what compiles
# within InferApp.grammar_timeout_s; this only keeps the walks over a spec (closing a
# schema, its formats) small where an admin raises the body limit.
MAX_SPEC_CHARS = 4 * 1024 * 1024
MAX_CHOICES = 10_000

# vLLM's names → ours; the native API takes the short names as top-level fields.
_VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
              "json_object": "json_object"}
_GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
# The fields that constrain an answer: the native API takes them all, the OpenAI routes all but
# the four short names.
CONSTRAINT_FIELDS = {"json_schema", "regex", "choice", "grammar", "response_format", "structured_outputs",
                     "guided_json", "guided_regex", "guided_choice", "guided_grammar"}
NATIVE_FIELDS = ("json_schema", "regex", "choice", "grammar")
OPENAI_FIELDS = CONSTRAINT_FIELDS - set(NATIVE_FIELDS)  # what the OpenAI routes read


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{param}' must be a non-empty string; got {show(value)}.", param=param)
    return _bounded(value, param)


def _bounded(text: str, param: str) -> str:
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequest(f"'{param}' is {len(text):,} characters; this server takes at most "
                             f"{MAX_SPEC_CHARS:,} for a constraint.", param=param)
    return text


def schema_constraint(schema: Any, param: str, name: str | None = None) -> Constraint:
    """A JSON schema as sent (an object, or JSON text of one; ``true`` means any JSON)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise InvalidRequest(f"'{param}' is not valid JSON: send a JSON schema object.", param=param) from None
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON schema (an object); got {show(schema)}.", param=param)
    return Constraint("json_schema", _bounded(json.dumps(schema), param), name)


def choice_constraint(choices: Any, param: str) -> Constraint:
    if (not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES
            or not all(isinstance(c, str) and c for c in choices)):
        raise InvalidRequest(f"'{param}' must be a list of 1 to {MAX_CHOICES:,} non-empty strings.", param=param)
    return Constraint("choice", _bounded(json.dumps(list(dict.fromkeys(choices))), param))


def _of_kind(kind: str, value: Any, param: str) -> Constraint:
    if kind == "json_schema":
        return schema_constraint(value, param)
    if kind == "json_object":
        if value not in (True, None, {}):
            raise InvalidRequest(f"'{param}' must be true.", param=param)
        return Constraint("json_object", "{}")
    if kind == "choice":
        return choice_constraint(value, param)
    return Constraint(kind, _text(value, param))  # regex, grammar: checked when compiled


def response_format(value: Any) -> Constraint | None:
    """OpenAI's ``response_format``: ``text`` (none), ``json_object``, or ``json_schema``
    with ``{name, schema, strict}``."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", "{}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec and "name" not in spec:
            raise InvalidRequest("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}.",
                                 param="response_format")
        name, strict = spec.get("name"), spec.get("strict")
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("'response_format.json_schema.name' must be a string.", param="response_format")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest("'response_format.json_schema.strict' must be true or false.", param="response_format")
        return replace(schema_constraint(spec.get("schema", {}), "response_format.json_schema.schema", name),
                       strict=strict)
    raise InvalidRequest(
        f"Unsupported response_format {show(value)}: use {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
        "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}.", param="response_format",
    )


def from_body(body: Mapping[str, Any], *, native: bool = False) -> Constraint | None:
    """The one constraint a request body asks for (``None``: none); two at once is a 400.
    ``native``: the native API's top-level ``json_schema``, ``regex``, ``choice``, ``grammar``."""
    found: list[tuple[str, Constraint]] = []
    rf = response_format(body.get("response_format")) if "response_format" in body else None
    if rf is not None:
        found.append(("response_format", rf))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequest("'structured_outputs' must be an object such as {\"json\": {...}}.",
                                 param="structured_outputs")
        for key, value in so.items():
            if key in _VLLM_KEYS and value is not None:
                found.append((f"structured_outputs.{key}", _of_kind(_VLLM_KEYS[key], value, f"structured_outputs.{key}")))
            elif key in ("disable_any_whitespace", "backend"):
                pass  # how vLLM builds the grammar: ours is compact JSON, llguidance's, whatever they say
            elif value is not None and value is not False:
                # e.g. structural_tag, whitespace_pattern: not enforced here, so refused, never dropped
                raise InvalidRequest(f"Unsupported structured_outputs field {show(key)}: use json, regex, choice, "
                                     "grammar or json_object.", param="structured_outputs")
    for key, kind in _GUIDED.items():
        if body.get(key) is not None:
            found.append((key, _of_kind(kind, body[key], key)))
    if native:
        for key in NATIVE_FIELDS:
            if body.get(key) is not None:
                found.append((key, _of_kind(key, body[key], key)))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise InvalidRequest(f"One constraint per request: this one sends {names}.", param=found[1][0])
    return replace(found[0][1], param=found[0][0].split(".")[0]) if found else None


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "additionalProperties")


def closed_schema(schema: Any, *, close: bool = True) -> Any:
    """``schema`` with no room for keys it does not declare (``additionalProperties: false``
    wherever an object lists its ``properties`` and says nothing of others): what OpenAI's
    strict mode requires, and what a tool call's arguments are meant to be. Only subschemas
    are walked (a ``const`` or ``enum`` value stays as it is); an object that takes keys from
    ``allOf``, ``$ref`` or a union stays open, and so do ``allOf``'s branches (closing one
    would refuse the keys of the others)."""
    if not isinstance(schema, dict):
        return schema
    out = _subschemas(schema, closed_schema, lambda sub: closed_schema(sub, close=False))
    merged = any(k in out for k in ("allOf", "anyOf", "oneOf", "$ref"))
    if close and "properties" in out and "additionalProperties" not in out and not merged:
        out["additionalProperties"] = False
    return out


# RFC 3339 allows a leap second (:60); llguidance's formats allow it at any minute, and the
# validators clients use (jsonschema, pydantic) refuse it. A time's seconds stay below 60.
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
_FORMAT_PATTERNS = {"date-time": "^.*T" + _TIME, "time": "^" + _TIME}


def seconds_below_60(schema: Any) -> Any:
    """``schema`` with a pattern beside every ``date-time`` or ``time`` format that has none
    (subschemas only: a ``const`` or ``enum`` value stays as it is)."""
    if not isinstance(schema, dict):
        return schema
    out = _subschemas(schema, seconds_below_60)
    if out.get("format") in _FORMAT_PATTERNS and "pattern" not in out:
        out["pattern"] = _FORMAT_PATTERNS[out["format"]]
    return out


def _subschemas(schema: dict[str, Any], fn: Any, branches: Any = None) -> dict[str, Any]:
    """A copy of ``schema`` with ``fn`` applied to each of its direct subschemas (``branches``
    instead for those of ``allOf``)."""
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: fn(sub) for name, sub in out[key].items()}
    for key in (*_SCHEMA_LISTS, "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [(branches or fn)(sub) if key == "allOf" else fn(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = fn(out[key])
    if isinstance(out.get("items"), list):
        out["items"] = [fn(sub) for sub in out["items"]]
    return out


@dataclass(frozen=True)
class ToolsConstraint(Constraint):
    """A ``tools`` constraint: the request's tool set itself (``tools.ToolSet``, whose
    ``constraint()`` makes this), carried from the body to the grammar and the answer.
    ``spec`` is that set as JSON, written once with it: the grammar's cache key, never read
    back into a set (there is no other way to a tools constraint)."""

    # Its tools.ToolSet, required (typed loosely: tools.py builds on this module, not the other way).
    tools: Any = field(kw_only=True, compare=False, repr=False)
