"""A corpus of JSON schemas for structured outputs (issue 19), written for this project.

``corpus()`` is what requests are expected to carry: tool-call arguments, extraction records,
pydantic models (built here with ``model_json_schema()``), ``$ref``/``$defs`` with a recursive
tree, enums, ``const``, unions, string formats and patterns, numeric bounds. Nearly every free
text field has a ``maxLength`` of at most 24, so that a random-weight model's constrained answer
ends; a few schemas (``*_unbounded``) leave text open for coverage.

``hostile()`` is what a grammar library must survive: deep unions, a huge enum, a regex that
backtracks catastrophically, hundreds of properties, recursion without a base case, values that
are not schemas, a dangling ``$ref``. Those are not all valid JSON Schema.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

Text = Annotated[str, Field(max_length=24)]
Short = Annotated[str, Field(max_length=8)]


def text(n: int = 24, **extra: Any) -> dict:
    """A free-text string of at most ``n`` characters."""
    return {"type": "string", "maxLength": n, **extra}


def obj(props: dict, required: list[str] | None = None, closed: bool = True, **extra: Any) -> dict:
    """An object schema; every property is required unless ``required`` says otherwise."""
    schema = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    if closed:
        schema["additionalProperties"] = False
    return {**schema, **extra}


def array(items: dict, lo: int | None = None, hi: int | None = None) -> dict:
    schema: dict = {"type": "array", "items": items}
    if lo is not None:
        schema["minItems"] = lo
    if hi is not None:
        schema["maxItems"] = hi
    return schema


INT, NUM, BOOL = {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


# -- pydantic v2 models ------------------------------------------------------------------------
class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Weather(BaseModel):
    city: Text
    unit: Unit = Unit.celsius
    days: int = Field(default=1, ge=1, le=14)


class Address(BaseModel):
    street: Text
    city: Text
    postcode: Annotated[str, Field(pattern=r"^[0-9]{5}$")]
    country: Literal["FR", "DE", "US", "GB", "JP"]


class Person(BaseModel):
    name: Text
    age: int = Field(ge=0, le=150)
    email: Annotated[str, Field(max_length=24, json_schema_extra={"format": "email"})]
    address: Address
    tags: list[Short] = Field(default_factory=list, max_length=4)


class Tree(BaseModel):
    label: Short
    children: list[Tree] = Field(default_factory=list, max_length=3)


class Event(BaseModel):
    id: uuid.UUID
    title: Text
    day: dt.date
    starts: dt.datetime
    attendees: list[Text] = Field(min_length=1, max_length=5)
    location: Text | None = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")
    owner: Text


class Invoice(BaseModel):
    number: Annotated[str, Field(pattern=r"^INV-[0-9]{4}$")]
    total: float = Field(gt=0, lt=1_000_000)
    currency: Literal["EUR", "USD", "GBP"]
    lines: list[tuple[Text, int]] = Field(min_length=1, max_length=3)
    paid: bool = False


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float = Field(ge=0, le=1)


class Step(BaseModel):
    explanation: Text
    output: Text


class Reasoning(BaseModel):
    steps: list[Step] = Field(max_length=3)
    final_answer: Text


class Open(BaseModel):
    """Unbounded text, kept for coverage."""

    title: str
    body: str


PYDANTIC = [Weather, Address, Person, Tree, Event, Pet, Invoice, Sentiment, Reasoning, Open]


# -- hand-written schemas -------------------------------------------------------------------------
def _tools() -> list[tuple[str, dict]]:
    """Tool-call argument shapes, as an OpenAI-style ``parameters`` object would carry them."""
    return [
        ("tool_get_weather", obj({"location": text(), "unit": {"enum": ["celsius", "fahrenheit"]}}, ["location"])),
        ("tool_web_search", obj({"query": text(), "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
                                 "safe": BOOL}, ["query"])),
        ("tool_calendar_create", obj({
            "title": text(), "start": {"type": "string", "format": "date-time"},
            "end": {"type": "string", "format": "date-time"},
            "attendees": array({"type": "string", "format": "email", "maxLength": 24}, 0, 4),
            "reminder_minutes": {"type": "integer", "enum": [0, 5, 10, 30, 60]},
        }, ["title", "start", "end"])),
        ("tool_send_email", obj({"to": {"type": "string", "format": "email", "maxLength": 24}, "subject": text(),
                                 "body": text(), "cc": array(text(), 0, 2)}, ["to", "subject", "body"])),
        ("tool_run_sql", obj({"query": text(), "database": {"enum": ["prod", "staging", "dev"]},
                              "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 60}})),
        ("tool_set_timer", obj({"seconds": {"type": "integer", "minimum": 1, "maximum": 86400}, "label": text(12)},
                               ["seconds"])),
        ("tool_book_flight", obj({
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "format": "date"}, "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "cabin": {"enum": ["economy", "premium", "business", "first"]},
        }, ["origin", "destination", "date"])),
        ("tool_translate", obj({"text": text(), "source": text(5), "target": {"enum": ["en", "fr", "de", "es", "ja"]}},
                               ["text", "target"])),
        ("tool_read_file", obj({"path": text(24, pattern="^/[a-z0-9_/.]+$"), "offset": {"type": "integer", "minimum": 0},
                                "limit": {"type": "integer", "minimum": 1, "maximum": 4096}}, ["path"])),
        ("tool_python_exec", obj({"code": text(), "timeout": {"type": "number", "minimum": 0.1, "maximum": 30}}, ["code"])),
        ("tool_call_envelope", obj({
            "name": {"enum": ["get_weather", "web_search", "set_timer"]},
            "arguments": {"type": "object", "maxProperties": 3, "additionalProperties": text(12)},
        })),
        ("tool_choice_oneof", {"oneOf": [
            obj({"name": {"const": "get_weather"}, "arguments": obj({"city": text()})}),
            obj({"name": {"const": "set_timer"}, "arguments": obj({"seconds": {"type": "integer", "minimum": 1}})}),
            obj({"name": {"const": "web_search"}, "arguments": obj({"query": text()})}),
        ]}),
        ("tool_parallel_calls", array(obj({"name": {"enum": ["lookup", "fetch"]}, "arguments": obj({"id": INT})}), 1, 3)),
    ]


def _shapes() -> list[tuple[str, dict]]:
    """Nesting, arrays, enums, const and unions."""
    point = obj({"x": NUM, "y": NUM})
    return [
        ("flat_record", obj({"name": text(), "count": INT, "ratio": NUM, "ok": BOOL})),
        ("optional_fields", obj({"a": text(), "b": INT, "c": BOOL, "d": text(8)}, ["a"])),
        ("nested_three_levels", obj({"outer": obj({"middle": obj({"inner": text(), "n": INT})}), "tag": text(8)})),
        ("array_of_points", obj({"points": array(point, 2, 4)})),
        ("array_fixed_len", obj({"rgb": array({"type": "integer", "minimum": 0, "maximum": 255}, 3, 3)})),
        ("array_of_enums", obj({"days": array({"enum": ["mon", "tue", "wed", "thu", "fri"]}, 1, 5)})),
        ("tuple_prefix_items", {"type": "array", "prefixItems": [text(8), INT, BOOL], "items": False}),
        ("matrix", obj({"rows": array(array(INT, 2, 2), 2, 2)})),
        ("enum_strings", {"enum": ["red", "green", "blue", "cyan", "magenta", "yellow"]}),
        ("enum_mixed", {"enum": ["auto", 1, 2.5, True, None]}),
        ("const_version", obj({"version": {"const": "1.0"}, "kind": {"const": "report"}, "title": text()})),
        ("anyof_scalar", {"anyOf": [INT, text(8), {"type": "null"}]}),
        ("anyof_objects", {"anyOf": [obj({"circle": obj({"r": NUM})}), obj({"rect": obj({"w": NUM, "h": NUM})})]}),
        ("oneof_payment", obj({"payment": {"oneOf": [
            obj({"method": {"const": "card"}, "last4": {"type": "string", "pattern": "^[0-9]{4}$"}}),
            obj({"method": {"const": "iban"}, "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{4,10}$"}}),
            obj({"method": {"const": "cash"}}),
        ]}})),
        ("nullable_type_list", obj({"note": {"type": ["string", "null"], "maxLength": 16}, "n": {"type": ["integer", "null"]}})),
        ("allof_merge", {"allOf": [obj({"id": INT}, closed=False), obj({"name": text()}, closed=False)]}),
        ("open_object", obj({"id": INT}, closed=False)),
        ("dict_of_ints", {"type": "object", "additionalProperties": INT, "maxProperties": 3}),
        ("classification", obj({"label": {"enum": ["spam", "ham"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
        ("multi_label", obj({"labels": array({"enum": ["bug", "feature", "docs", "question"]}, 1, 3)})),
        ("chain_of_thought", obj({"thought": text(), "answer": {"type": "integer"}})),
        ("extraction_entities", obj({"entities": array(obj({"text": text(), "type": {"enum": ["PER", "ORG", "LOC"]},
                                                           "start": {"type": "integer", "minimum": 0}}), 0, 4)})),
        ("qa_with_sources", obj({"answer": text(), "sources": array({"type": "string", "format": "uri", "maxLength": 24}, 1, 2)})),
        ("boolean_only", BOOL),
        ("null_only", {"type": "null"}),
        ("array_unbounded_ints", array(INT)),
        ("text_unbounded", obj({"summary": {"type": "string"}, "keywords": array({"type": "string"})})),
        ("any_json_unbounded", {}),
    ]


def _formats_and_bounds() -> list[tuple[str, dict]]:
    """String formats and patterns, numeric bounds."""
    s = lambda **kw: {"type": "string", **kw}  # noqa: E731
    return [
        ("format_date", obj({"day": s(format="date")})),
        ("format_datetime", obj({"at": s(format="date-time")})),
        ("format_time", obj({"at": s(format="time")})),
        ("format_email", obj({"email": s(format="email", maxLength=24)})),
        ("format_uuid", obj({"id": s(format="uuid")})),
        ("format_ipv4", obj({"ip": s(format="ipv4")})),
        ("format_mix", obj({"id": s(format="uuid"), "created": s(format="date-time"), "birthday": s(format="date"),
                            "contact": s(format="email", maxLength=24)})),
        ("pattern_phone", obj({"phone": s(pattern=r"^\+[1-9][0-9]{7,12}$")})),
        ("pattern_semver", obj({"version": s(pattern=r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$", maxLength=14)})),
        ("pattern_hex_color", obj({"color": s(pattern="^#[0-9a-fA-F]{6}$")})),
        ("pattern_slug", obj({"slug": s(pattern="^[a-z0-9]+(-[a-z0-9]+)*$", maxLength=20)})),
        ("string_min_max_len", obj({"code": s(minLength=4, maxLength=6)})),
        ("int_range", obj({"n": {"type": "integer", "minimum": -50, "maximum": 50}})),
        ("int_exclusive", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}})),
        ("int_large_range", obj({"n": {"type": "integer", "minimum": -123456789, "maximum": 987654321}})),
        ("number_range", obj({"t": {"type": "number", "minimum": -273.15, "maximum": 1000}})),
        ("number_exclusive", obj({"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}})),
        ("number_multiple_of", obj({"step": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}})),
        ("geo", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                     "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ]


def _refs() -> list[tuple[str, dict]]:
    """``$ref`` and ``$defs``, including recursion with a base case."""
    node = {"$ref": "#/$defs/node"}
    return [
        ("ref_shared_def", {"$defs": {"money": obj({"amount": NUM, "currency": {"enum": ["EUR", "USD"]}})},
                            **obj({"price": {"$ref": "#/$defs/money"}, "tax": {"$ref": "#/$defs/money"}})}),
        ("ref_chain", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": text(8)},
                       **obj({"v": {"$ref": "#/$defs/a"}})}),
        ("ref_recursive_tree", {"$defs": {"node": obj({"value": INT, "children": array(node, 0, 2)})}, **node}),
        ("ref_recursive_list", {"$defs": {"cell": obj({"head": INT, "tail": {"anyOf": [{"$ref": "#/$defs/cell"},
                                                                                      {"type": "null"}]}})},
                                "$ref": "#/$defs/cell"}),
        ("ref_json_value", {"$defs": {"v": {"anyOf": [INT, BOOL, {"type": "null"}, text(8),
                                                      array({"$ref": "#/$defs/v"}, 0, 3)]}}, "$ref": "#/$defs/v"}),
        ("ref_legacy_definitions", {"definitions": {"tag": text(8)}, **obj({"tags": array({"$ref": "#/definitions/tag"}, 0, 3)})}),
    ]


def corpus() -> list[tuple[str, dict]]:
    """The (name, schema) pairs a request may carry; every one is valid JSON Schema 2020-12."""
    models = [(f"pydantic_{m.__name__.lower()}", m.model_json_schema()) for m in PYDANTIC]
    return models + _tools() + _shapes() + _formats_and_bounds() + _refs()


def _deep_union(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for level in range(depth):
        schema = {"anyOf": [{"type": "null"}, text(4), obj({f"k{level}": schema})]}
    return schema


def hostile() -> list[tuple[str, Any]]:
    """(name, schema or raw schema text) pairs a grammar library must refuse or survive."""
    many = {f"field_{i}": INT for i in range(300)}
    return [
        ("deep_union_25", _deep_union(25)),
        ("deep_union_50", _deep_union(50)),
        ("huge_enum_20k", {"enum": [f"value-{i:05d}" for i in range(20_000)]}),
        ("catastrophic_regex", {"type": "string", "pattern": "(a+)+$"}),
        ("catastrophic_regex_alt", {"type": "string", "pattern": "^(a|aa)*(b|c)+(x+x+)+y$"}),
        ("props_300_required", obj(many)),
        ("props_300_optional", obj(many, required=[])),
        ("recursive_no_base", {"$defs": {"n": obj({"next": {"$ref": "#/$defs/n"}})}, "$ref": "#/$defs/n"}),
        ("recursive_self_root", {"$ref": "#"}),
        ("bare_string", "string"),
        ("bare_true", True),
        ("bare_false", False),
        ("not_json_text", "{not json"),
        ("invalid_ref", obj({"a": {"$ref": "#/$defs/missing"}})),
        ("remote_ref", obj({"a": {"$ref": "https://example.invalid/schema.json"}})),
        ("array_min_1000", array(INT, 1000, 5000)),
        ("string_min_10k", {"type": "string", "minLength": 10_000, "maxLength": 100_000}),
        ("unsatisfiable", {"allOf": [{"type": "integer"}, {"type": "string"}]}),
    ]
