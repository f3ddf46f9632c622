"""The package's floors (docs/architecture.md): lower ones never import upper ones, and no
module imports itself back through others (imports inside functions and under TYPE_CHECKING
count too)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_infer"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (``from . import x`` of a submodule is an
    import of ``x`` alone)."""
    modules, graph = module_names(), defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_there_are_no_import_circles() -> None:
    graph = import_graph()
    assert cycles(graph) == []
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            pa, pb = ".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])
            if pa != pb:
                packages[pa].add(pb)
    assert cycles(packages) == []


# The layer picture (docs/architecture.md), bottom up: a module may import its own floor and
# the floors below it, never one above. The top-level ``__init__`` (lazy names) stands apart.
FLOORS = [
    ("errors", "_version"),
    ("values",),
    ("constraints",),
    ("wire",),
    ("cpu",),
    ("formats",),
    ("text",),
    ("decoding",),
    ("speculative",),
    ("engine",),
    ("scheduler",),
    ("upstream",),
    ("loops",),
    ("service",),
    ("server",),
    ("kernel",),
    ("commands",),
]
LEVEL = {name: i for i, floor in enumerate(FLOORS) for name in floor}
# The server and the kernel side reach a model only through the service seam.
THROUGH_THE_SERVICE = {"server": {"scheduler", "upstream", "loops"}, "kernel": {"scheduler", "upstream", "loops", "server"}}
# The engine runs token ids: the bodies and answers of the HTTP routes (wire) are not its
# business, and what it knows of text comes through text/ (its ``ModelText``).
THROUGH_THE_SERVICE.update({floor: {"wire"} for floor in ("decoding", "speculative", "engine")})


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow that breaks the picture: to a floor above, or around the service seam."""
    bad = []
    for a, targets in graph.items():
        fa = floor_of(a)
        if fa is None:
            continue
        for b in targets:
            fb = floor_of(b)
            if fb is None or LEVEL[fb] > LEVEL[fa] or fb in THROUGH_THE_SERVICE.get(fa, ()):
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_every_module_lives_on_a_floor_of_the_picture() -> None:
    homeless = sorted(n for n in module_names() if n != "jupyter_infer" and floor_of(n) not in LEVEL)
    assert homeless == []


def test_no_floor_imports_one_above_it() -> None:
    assert upward_imports(import_graph()) == []


def test_no_two_modules_share_a_name() -> None:
    # A name says one thing: two ``loop.py`` or two ``config.py`` make a reader ask which.
    seen: dict[str, list[str]] = defaultdict(list)
    for name, path in module_names().items():
        if path.name != "__init__.py":
            seen[path.stem].append(name)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    # The checks above would pass on an empty graph: they must see what they look for.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = import_graph()
    assert "jupyter_infer.engine" in graph["jupyter_infer.scheduler.scheduler"]
    assert "jupyter_infer.scheduler" in graph["jupyter_infer.upstream.admission"]
    assert upward_imports({"jupyter_infer.engine.hf.hf_engine": {"jupyter_infer.loops.engine_loop"},
                           "jupyter_infer.server.app": {"jupyter_infer.loops.loop_factory"},
                           "jupyter_infer.loops.engine_loop": {"jupyter_infer.engine.hf.hf_engine"}}) == [
        "jupyter_infer.engine.hf.hf_engine -> jupyter_infer.loops.engine_loop",
        "jupyter_infer.server.app -> jupyter_infer.loops.loop_factory",
    ]


MAX_MODULE_LINES = 450  # a module longer than this holds more than one job
MAX_FUNCTION_LINES = 80


def test_modules_and_functions_stay_small() -> None:
    long_modules, long_functions = [], []
    for name, path in module_names().items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}")
    assert (long_modules, long_functions) == ([], [])
