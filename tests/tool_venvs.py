"""The heavy ecosystem tools the compatibility tests drive (lm-eval, guidellm), each in a
virtual environment of its own under ``.venv-tools/``: their pins conflict with each other
and with ours, and neither belongs in the project's own environment.

Created on first use (from PyPI; torch from the CPU wheel the Makefile pins too), reused
after; ``make tools`` (a prerequisite of ``make test``) builds them ahead of the test run.
Run directly: ``python tests/tool_venvs.py [name ...]``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / ".venv-tools"
# Each step is one pip call: torch first, so the CPU wheel is what the tool then finds.
TOOLS: dict[str, list[list[str]]] = {
    "lm-eval": [["lm-eval[api]==0.4.13", "transformers==5.24.0"]],
    "guidellm": [["torch==2.13.0"], ["guidellm==0.8.1"]],
}
COMMANDS = {"lm-eval": "lm_eval", "guidellm": "guidellm"}


def _stamp(name: str) -> Path:
    digest = hashlib.sha256(repr(TOOLS[name]).encode()).hexdigest()[:12]
    return ROOT / name / f".installed-{digest}"


def ensure(name: str) -> Path:
    """The command of tool ``name``, installing its environment first if needed."""
    env = ROOT / name
    command = env / "bin" / COMMANDS[name]
    if _stamp(name).exists() and command.exists():
        return command
    print(f"tool_venvs: installing {name} into {env} (once)", file=sys.stderr, flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    for step in TOOLS[name]:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *step], check=True,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    _stamp(name).touch()
    return command


if __name__ == "__main__":
    for tool in sys.argv[1:] or list(TOOLS):
        print(ensure(tool))
