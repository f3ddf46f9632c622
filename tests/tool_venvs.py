"""The heavy ecosystem tools the compatibility tests drive, each installed under
``.venv-tools/<name>``: lm-eval and guidellm in a virtual environment of its own (their pins
conflict with each other and with ours, and neither belongs in the project's own environment),
Jupyter AI installed *beside* us (an environment that sees the project's own through a ``.pth``
file, as a user's ``pip install jupyter-ai`` next to jupyter_infer would, without every other
test's server loading its extensions), and JupyterHub's proxy, configurable-http-proxy, from
npm (for tests/server/test_hub_service.py).

Created on first use (from PyPI, torch from the CPU wheel the Makefile pins too; from npm),
reused after; ``make tools`` (a prerequisite of ``make test``) builds them ahead of the test
run, leaving out the npm ones where npm is missing (their tests skip then).
Run directly: ``python tests/tool_venvs.py [name ...]``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / ".venv-tools"
# Each step is one pip call: torch first, so the CPU wheel is what the tool then finds.
TOOLS: dict[str, list[list[str]]] = {
    "lm-eval": [["lm-eval[api]==0.4.13", "transformers==5.24.0"]],
    "guidellm": [["torch==2.13.0"], ["guidellm==0.8.1"]],
    "jupyter-ai": [["jupyter-ai[jupyternaut]==3.2.0"]],
    "notebook-intelligence": [["notebook-intelligence==6.2.0"]],
}
# Tools that run inside the project's environment: theirs sees ours (site.addsitedir in a .pth
# file, so that our editable install's own .pth files are read too); what they add shadows it.
# Each with the module its install check imports.
BESIDE_US = {"jupyter-ai": "jupyter_ai_jupyternaut", "notebook-intelligence": "notebook_intelligence"}
# Node packages, one `npm install` each (exact versions: 5.2.0 is the newest that runs on node 20).
NPM_TOOLS: dict[str, str] = {"configurable-http-proxy": "configurable-http-proxy@5.2.0"}
COMMANDS = {"lm-eval": "lm_eval", "guidellm": "guidellm", "configurable-http-proxy": "configurable-http-proxy",
            "jupyter-ai": "python", "notebook-intelligence": "python"}


def _stamp(name: str) -> Path:
    spec = NPM_TOOLS[name] if name in NPM_TOOLS else TOOLS[name]
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    return ROOT / name / f".installed-{digest}"


def _command(name: str) -> Path:
    bin_dir = ROOT / name / ("node_modules/.bin" if name in NPM_TOOLS else "bin")
    return bin_dir / COMMANDS[name]


def ensure(name: str) -> Path:
    """The command of tool ``name``, installing it first if needed."""
    env = ROOT / name
    command = _command(name)
    if _stamp(name).exists() and command.exists():
        return command
    print(f"tool_venvs: installing {name} into {env} (once)", file=sys.stderr, flush=True)
    if name in NPM_TOOLS:
        _npm_install(env, NPM_TOOLS[name])
    else:
        _pip_install(env, TOOLS[name], beside_us=name in BESIDE_US)
    # The stamp says the tool runs, not only that the installer returned.
    check = ["-c", f"import {BESIDE_US[name]}, jupyter_infer"] if name in BESIDE_US else ["--help"]
    subprocess.run([str(command), *check], check=True, env=_clean_env(), capture_output=True)
    _stamp(name).touch()
    return command


def _npm_install(env: Path, package: str) -> None:
    if shutil.which("npm") is None:
        raise RuntimeError(f"npm is needed to install {package}: install Node.js (20 or newer)")
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run(["npm", "install", "--prefix", str(env), "--no-audit", "--no-fund",
                    "--loglevel=error", package], check=True)


def _pip_install(env: Path, steps: list[list[str]], beside_us: bool = False) -> None:
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    if beside_us:
        ours = sysconfig.get_path("purelib")  # this interpreter's: the project's .venv
        theirs = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                check=True, capture_output=True, text=True).stdout.strip()
        Path(theirs, "zz_jupyter_infer_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    for step in steps:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *step], check=True,
                       env={**_clean_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def _clean_env() -> dict[str, str]:
    # Not our PYTHONPATH (a Jupyter server under test sets it to our environment): pip would
    # take our packages as already installed and leave the tool's environment without them.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


if __name__ == "__main__":
    for tool in sys.argv[1:] or [*TOOLS, *NPM_TOOLS]:
        if tool in NPM_TOOLS and not sys.argv[1:] and shutil.which("npm") is None:
            print(f"tool_venvs: no npm, so no {tool} (its tests skip)", file=sys.stderr)
            continue
        print(ensure(tool))
