"""Where a model the user named is: a checkpoint folder, a GGUF file, or a Hub id (in the local
cache, or downloadable now). A name that is none of those is refused here, in one line that
names the path and the way out, before transformers answers in its own words ("Repo id must be
in the form 'repo_name' or 'namespace/repo_name'" for a missing folder, "You need to have
sentencepiece or tiktoken installed" for a folder that is not a model) or retries an
unreachable Hub for a minute.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

# What a user can do instead, said at the end of every refusal.
WAYS_OUT = ("give a Hugging Face checkpoint folder (config.json and *.safetensors), a .gguf file, "
            "or make a small test model: jupyter infer make-model DIR")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")


class ModelNotFound(ValueError):
    """The named model cannot be found where it was said to be; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    name: str  # as the user gave it
    path: str  # the folder or file (user's ~ expanded), or the Hub id
    kind: Literal["folder", "gguf", "hub"]
    local_files_only: bool  # the Hub is not to be asked (a local path, or the Hub unreachable)


def locate(name: str, *, hub_reachable: Callable[[], bool] | None = None) -> ModelSource:
    """Where ``name`` is, or ``ModelNotFound`` saying why not and what to do instead.
    ``hub_reachable``: asked only for a Hub id that is not in the local cache."""
    if not name.strip():
        raise ModelNotFound(f"No model was named: {WAYS_OUT}.")
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _starts_with_gguf_magic(path):
            return ModelSource(name, str(path), "gguf", True)
        raise ModelNotFound(f"{name} is a file but not a GGUF model (.gguf): {WAYS_OUT}.")
    if path.is_dir():
        return ModelSource(name, str(path), _checked_folder(name, path), True)
    if _looks_like_a_path(name):
        what = "no such GGUF file" if name.lower().endswith(".gguf") else "nothing is there"
        raise ModelNotFound(f"No model at {name}: {what}. Check the path, or {WAYS_OUT}.")
    if not _HUB_ID.match(name):
        raise ModelNotFound(f"{name!r} is neither a local path nor a Hugging Face model id (name or "
                            f"owner/name): {WAYS_OUT}.")
    if _in_hub_cache(name):
        return ModelSource(name, name, "hub", hub_offline() or not (hub_reachable or _hub_reachable)())
    if hub_offline():
        raise ModelNotFound(f"{name} is not under InferApp.model_dirs nor in the Hugging Face cache, and the Hub "
                            f"is switched off here (HF_HUB_OFFLINE): download it where there is a network (hf download {name}), "
                            f"or {WAYS_OUT}.")
    if not (hub_reachable or _hub_reachable)():
        raise ModelNotFound(f"{name} is not under InferApp.model_dirs nor in the Hugging Face cache, and the Hub "
                            f"cannot be reached from here: download it where there is a network (hf download "
                            f"{name}) and copy the cache over, or {WAYS_OUT}.")
    return ModelSource(name, name, "hub", False)


def _checked_folder(name: str, path: Path) -> Literal["folder", "gguf"]:
    if (path / "config.json").is_file():
        return "folder"
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if ggufs:
        raise ModelNotFound(f"{name} is a folder of GGUF files, not a checkpoint folder (no config.json): "
                            f"name the file, e.g. {path / ggufs[0]}.")
    raise ModelNotFound(f"{name} is not a model folder (it has no config.json): {WAYS_OUT}.")


def _starts_with_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _looks_like_a_path(name: str) -> bool:
    """What only a path looks like: ``/``, ``./``, ``~`` or a drive first, a ``.gguf`` end, or
    more than one ``/`` (a Hub id has at most one)."""
    return (name.startswith(("/", "./", "../", "~", ".\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", name))
            or name.lower().endswith(".gguf") or name.count("/") > 1 or "\\" in name)


def _in_hub_cache(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # a malformed id, an unreadable cache: not there
        return False


def hub_offline() -> bool:
    """The user switched the Hub off (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_reachable(timeout: float = 1.5) -> bool:
    """One TCP connect to the Hub (``HF_ENDPOINT``): a second, not a minute of retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False
