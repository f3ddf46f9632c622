"""The JupyterLab extension as shipped: prebuilt assets that match their sources, installed by
the wheel as shared data; and its TypeScript unit tests (where node and its packages are).

The built assets are committed (labextension/README.md says why). The last build step records
a SHA-256 over the sources; the check here recomputes it without node, so a change to the
TypeScript or CSS that was not rebuilt fails on any machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jupyter_infer

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "labextension"
BUILT = ROOT / "jupyter_infer" / "labextension"
WIDGET = ROOT / "jupyter_infer" / "widgets" / "static"

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
        "labextension/ and commit jupyter_infer/labextension and jupyter_infer/widgets/static"
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
