"""Python functions as tools: the OpenAI tool spec of a function, from its signature and its
docstring (the arguments' JSON Schema by pydantic, closed to the declared parameters)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from ...constraints.spec import closed_schema


def function_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {name, description, parameters}}`` for ``fn``:
    each parameter's annotation (``str`` when it has none) and default; the docstring's first
    paragraph describes it."""
    try:
        import pydantic
    except ImportError:  # pragma: no cover - pydantic comes with the openai SDK and most stacks
        raise ImportError("Python functions as tools need pydantic: pip install pydantic") from None
    hints = typing.get_type_hints(fn, include_extras=True)  # Annotated[str, Field(max_length=8)] keeps its bounds
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, str), default)
    schema = closed_schema(pydantic.create_model(fn.__name__, **fields).model_json_schema())
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    doc = inspect.getdoc(fn) or ""
    return {"type": "function", "function": {"name": fn.__name__, "description": doc.split("\n\n")[0],
                                             "parameters": schema}}


def as_tool(tool: Callable[..., Any] | dict[str, Any]) -> dict[str, Any]:
    """A tool as the API takes it: a function's spec, or an OpenAI tool dict as it is."""
    return tool if isinstance(tool, dict) else function_tool(tool)
