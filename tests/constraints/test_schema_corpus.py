"""The JSON schema corpus of issue 19 (``jupyter_infer/commands/bench/schemas.py``): large enough, every
schema valid, free text mostly bounded, and llguidance compiles (nearly) all of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from jupyter_infer.commands.bench.schemas import corpus, hostile


def strings(schema: Any) -> Iterator[dict]:
    """Every subschema of type string, however deep."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" or "string" in (schema.get("type") or []):
            yield schema
        for value in schema.values():
            yield from strings(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from strings(value)


def free_text(s: dict) -> bool:
    return not any(k in s for k in ("enum", "const", "pattern", "format"))


def test_the_corpus_is_large_named_and_valid_json_schema() -> None:
    schemas = corpus()
    names = [name for name, _ in schemas]
    assert len(schemas) >= 50
    assert len(set(names)) == len(names)
    assert not set(names) & {name for name, _ in hostile()}
    for name, schema in schemas:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:  # pragma: no cover - the message names the schema
            pytest.fail(f"{name}: {e.message}")


def test_the_corpus_covers_what_issue_19_lists() -> None:
    text = repr(corpus())
    for keyword in ("$defs", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "minItems", "maxItems",
                    "exclusiveMinimum", "pattern", "'additionalProperties': False", "'format': 'date'",
                    "'format': 'date-time'", "'format': 'email'", "'format': 'uuid'"):
        assert keyword in text, keyword
    assert sum(name.startswith("pydantic_") for name, _ in corpus()) >= 8
    assert sum(name.startswith("tool_") for name, _ in corpus()) >= 10


def test_most_free_text_is_bounded_so_random_answers_end() -> None:
    bounded = [name for name, schema in corpus()
               if all(s.get("maxLength", 10**9) <= 24 for s in strings(schema) if free_text(s))]
    assert len(bounded) >= 0.9 * len(corpus())
    assert len(bounded) < len(corpus())  # a few are left open on purpose


def test_the_hostile_cases_are_there() -> None:
    cases = dict(hostile())
    assert len(cases["huge_enum_20k"]["enum"]) == 20_000
    assert len(cases["props_300_required"]["properties"]) == 300
    assert cases["catastrophic_regex"]["pattern"] == "(a+)+$"
    assert {"bare_string", "bare_true", "invalid_ref", "recursive_no_base", "deep_union_50"} <= set(cases)


def test_llguidance_compiles_the_corpus(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from benchmarks.grammar_libs import LLGuidance, run_schema

    lib = LLGuidance(AutoTokenizer.from_pretrained(tiny_model_dir))
    results = {name: run_schema(lib, schema, 4) for name, schema in corpus()}
    failed = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert len(results) - len(failed) >= 0.95 * len(results), failed
