"""The JupyterLab extension as shipped: prebuilt assets that match their sources, installed by
the wheel as shared data; and its TypeScript unit tests (where node and its packages are).

The built assets are committed (labextension/README.md says why). The last build step records
a SHA-256 over the sources; the check here recomputes it without node, so a change to the
TypeScript or CSS that was not rebuilt fails on any machine. Where node is, the notebook bundle
as built also draws a real server's records (a constrained request's marks) in happy-dom.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import jupyter_infer
from jupyter_infer.kernel.widgets.timeline import timeline_data

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "labextension"
BUILT = ROOT / "jupyter_infer" / "labextension"
WIDGET = ROOT / "jupyter_infer" / "kernel" / "widgets" / "static"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def source_hash(inputs: list[str]) -> str:
    """The digest scripts/source-stamp.mjs computes: each file's path and text, in order."""
    digest = hashlib.sha256()
    for name in inputs:
        for file in _walk(SOURCE / name):
            digest.update(file.relative_to(SOURCE).as_posix().encode() + b"\0")
            digest.update(file.read_text(encoding="utf-8").replace("\r\n", "\n").encode() + b"\0")
    return digest.hexdigest()


def _walk(path: Path) -> list[Path]:
    """Files under ``path`` as the script lists them: directory by directory, names sorted."""
    if path.is_file():
        return [path]
    return [f for child in sorted(path.iterdir(), key=lambda p: p.name) for f in _walk(child)]


def test_built_assets_match_their_sources() -> None:
    stamp = json.loads((BUILT / "source-stamp.json").read_text())
    assert source_hash(stamp["sources"]) == stamp["sha256"], (
        "labextension/ changed since the committed build: run `npm ci && npm run build` in "
        "labextension/ and commit jupyter_infer/labextension and jupyter_infer/kernel/widgets/static"
    )
    # The anywidget bundle and stylesheet come from the same build.
    assert (WIDGET / "timeline.css").read_text() == (SOURCE / "style" / "timeline.css").read_text()
    assert "Built from labextension/src/timeline/" in (WIDGET / "timeline.js").read_text()


def test_the_wheel_installs_the_prebuilt_extension() -> None:
    meta = json.loads((BUILT / "package.json").read_text())
    assert meta["name"] == "jupyter-infer"
    assert (BUILT / meta["jupyterlab"]["_build"]["load"]).is_file()
    assert (BUILT / "static" / "style.js").is_file()
    schema = json.loads((BUILT / "schemas" / "jupyter-infer" / "plugin.json").read_text())
    assert {"refreshInterval", "timeWindow"} <= set(schema["properties"])
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["jupyter_infer/labextension"] == "share/jupyter/labextensions/jupyter-infer"
    assert jupyter_infer._jupyter_labextension_paths() == [{"src": "labextension", "dest": "jupyter-infer"}]


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs node and npm")
def test_typescript_unit_tests() -> None:
    """SSE parsing, timeline layout and drawing, the live event model (vitest)."""
    if not (SOURCE / "node_modules" / ".bin" / "vitest").exists():
        pytest.skip("labextension/node_modules is missing: run `npm ci` in labextension/")
    done = subprocess.run(["npm", "test", "--silent"], cwd=SOURCE, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


# Draws a timeline state with the built notebook bundle in happy-dom (no animation frames, so
# it draws at once), hovers each row, and says what it drew.
DRAW_IN_NODE = r"""
const [happyDom, bundle, statePath] = process.argv.slice(2);
const { readFileSync } = await import('node:fs');
const { Window } = await import(happyDom);
const window = new Window({ width: 900, height: 700 });
globalThis.window = window;
globalThis.document = window.document;
globalThis.MouseEvent = window.MouseEvent;
const state = JSON.parse(readFileSync(statePath, 'utf8'));
const { default: widget } = await import(bundle);
const el = document.createElement('div');
document.body.appendChild(el);
widget.render({ model: { get: k => state[k], on: () => {}, off: () => {} }, el });
const rows = [...el.querySelectorAll('g.ji-row')].map(g => {
  g.querySelector('rect.ji-part').dispatchEvent(new MouseEvent('mousemove', { bubbles: true, clientX: 300, clientY: 40 }));
  return {
    id: g.getAttribute('data-id'),
    constraint: g.getAttribute('data-constraint'),
    badge: g.querySelector('.ji-constraint-badge text')?.textContent ?? null,
    outlines: g.querySelectorAll('.ji-constraint-outline').length,
    tip: el.querySelector('.ji-tl-tip').textContent
  };
});
const bands = [...el.querySelectorAll('rect.ji-band')].map(r => r.getAttribute('aria-label'));
console.log(JSON.stringify({ rows, bands, legend: el.querySelector('.ji-legend').textContent }));
"""


def _draw_in_node(state: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "draw.mjs").write_text(DRAW_IN_NODE)
    happy_dom = SOURCE / "node_modules" / "happy-dom" / "lib" / "index.js"
    done = subprocess.run(
        ["node", str(tmp_path / "draw.mjs"), happy_dom.as_uri(), (WIDGET / "timeline.js").as_uri(),
         str(tmp_path / "state.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
async def test_the_built_timeline_marks_a_constrained_request(jp_fetch: Any, tmp_path: Path) -> None:
    """A real server's records of a JSON-schema request and a free one, drawn by the bundle
    the wheel ships: the constrained row has its badge, outline, kind and forced tokens."""
    if not (SOURCE / "node_modules" / "happy-dom").exists():
        pytest.skip("labextension/node_modules is missing: run `npm ci` in labextension/")

    async def generate(body: dict[str, Any]) -> dict[str, Any]:
        return json.loads((await jp_fetch("infer", "generate", method="POST", body=json.dumps(body))).body)

    constrained = await generate({"prompt": "x", "json_schema": SCHEMA})
    free = await generate({"prompt": "What is a KV cache?", "max_tokens": 12})
    assert json.loads(constrained["text"])["a"] in ("x", "y")
    payload = json.loads((await jp_fetch("infer", "batches")).body)
    records = {r["id"]: r for r in payload["requests"]}
    record = records[constrained["id"]]
    assert record["constraint"] == "json_schema" and 0 < record["forced_tokens"] <= record["completion_tokens"]
    assert records[free["id"]]["constraint"] is None and records[free["id"]]["forced_tokens"] == 0

    rows, batches = timeline_data(payload, [constrained["id"], free["id"]], labels={constrained["id"]: "x (JSON)"})
    assert rows[0]["constraint"] == "json_schema" and rows[0]["forced_tokens"] == record["forced_tokens"]
    drawn = _draw_in_node({"requests": rows, "batches": batches, "now": None, "title": ""}, tmp_path)
    mark, plain = drawn["rows"]
    assert (mark["constraint"], mark["badge"], mark["outlines"]) == ("json_schema", "{}", 1)
    forced, tokens = record["forced_tokens"], record["completion_tokens"]
    assert f"constrained: JSON schema · {forced} of {tokens} tokens fast-forwarded" in mark["tip"]
    assert (plain["constraint"], plain["badge"], plain["outlines"]) == (None, None, 0)
    assert "constrained" not in plain["tip"]
    assert any(f"tokens, {forced} fast-forwarded" in band for band in drawn["bands"]), drawn["bands"]
    assert "constrained: JSON schema" in drawn["legend"] and "fast-forwarded" in drawn["legend"]
