"""The models this machine can serve without a download: the Hugging Face cache, checkpoint
folders and GGUF files under the configured folders (``InferApp.model_dirs``), and Ollama's
local store (its GGUF blobs, by ``name:tag``). What ``infer/models``, ``v1/models``, the panel
and ``%infer_model`` list, and what a request or a switch may name by its short id.

Reading only: directory listings, JSON manifests and file sizes, no weights, so listing is
cheap enough to answer a request (and is capped, for a folder with thousands of files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_MODELS = 500  # a listing stops here (a folder of thousands of files)
DEPTH = 2  # how deep under a configured folder to look


@dataclass(frozen=True)
class LocalModel:
    id: str  # what to name it by: a Hub id, Ollama's name:tag, or its path under its model_dirs folder
    path: str  # what InferApp.model takes for it (a folder, a .gguf file, a Hub id)
    source: str  # "huggingface" (the cache), "folder", "gguf" or "ollama"
    size_bytes: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def local_models(folders: Sequence[str] = (), *, hf_cache: bool = True,
                 ollama: Path | None = None) -> list[LocalModel]:
    """Every model found, each once (by path), in the order: folders, Hugging Face, Ollama."""
    found: dict[str, LocalModel] = {}
    ids: set[str] = set()
    for model in _chain(_in_folders(folders), _in_hf_cache() if hf_cache else iter(()),
                        _in_ollama(ollama if ollama is not None else ollama_store())):
        if model.path in found:
            continue
        if model.id in ids:  # the same short name under two folders: the later one by its path
            model = LocalModel(model.path, model.path, model.source, model.size_bytes)
        found[model.path] = model
        ids.add(model.id)
        if len(found) >= MAX_MODELS:
            break
    return list(found.values())


def in_model_dirs(name: str, folders: Sequence[str]) -> str | None:
    """The path of the model ``name`` names under one of ``folders`` (``small`` for
    ``~/models/small``, ``team/q4.gguf``), as the listing names it; ``None``: not there (or
    ``name`` is a path of its own). Only the named paths are looked at, no folder is walked."""
    if not name or Path(name).expanduser().is_absolute() or name.startswith(("~", ".")) or Path(name).exists():
        return None
    for folder in folders:
        candidate = Path(folder).expanduser() / name
        if (candidate / "config.json").is_file() or (candidate.suffix.lower() == ".gguf" and candidate.is_file()):
            return str(candidate)
    return None


def find(name: str, models: Sequence[LocalModel]) -> LocalModel | None:
    """The listed model ``name`` stands for: its id, its path, or a folder's or file's own
    name where only one listed model has it (``gpt-tiny`` for ``~/models/gpt-tiny``)."""
    exact = next((m for m in models if name in (m.id, m.path)), None)
    if exact is not None or "/" in name:
        return exact
    by_name = [m for m in models if m.source in ("folder", "gguf") and Path(m.path).name == name]
    return by_name[0] if len(by_name) == 1 else None


def in_ollama_store(name: str, store: Path | None = None) -> LocalModel | None:
    """The model of Ollama's store that ``name`` names (``qwen2.5:0.5b``; ``qwen2.5`` for its
    ``:latest``); ``None``: none, or ``name`` is a path of its own. Only the manifests are read."""
    if not name or name.startswith(("/", "~", ".")) or Path(name).exists():
        return None
    wanted = name if ":" in name else f"{name}:latest"
    return next((m for m in _in_ollama(store if store is not None else ollama_store()) if m.id == wanted), None)


def short_name(path: str, folders: Sequence[str], store: Path | None = None) -> str | None:
    """The name the listing gives the model at ``path`` if it lies under one of ``folders``
    (``small`` for ``~/models/small``) or is a blob of Ollama's store (``qwen2.5:0.5b``);
    ``None`` otherwise. No folder is walked (the store's manifests are read)."""
    where = Path(path).expanduser()
    for folder in folders:
        root = Path(folder).expanduser()
        if where == root:
            return where.name
        if where.is_relative_to(root):
            return where.relative_to(root).as_posix()
    store = store if store is not None else ollama_store()
    if where.is_relative_to(store / "blobs"):
        return next((m.id for m in _in_ollama(store) if m.path == str(where)), None)
    return None


def ollama_store() -> Path:
    """Where Ollama keeps its models (``OLLAMA_MODELS``, else ``~/.ollama/models``)."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def _chain(*sources: Iterator[LocalModel]) -> Iterator[LocalModel]:
    for source in sources:
        yield from source


def _in_folders(folders: Sequence[str]) -> Iterator[LocalModel]:
    for folder in folders:
        root = Path(folder).expanduser()
        if root.is_dir():
            yield from _walk(root, DEPTH, root)


def _short(path: Path, root: Path) -> str:
    """A model's name under its configured folder (the folder's own name if it is one)."""
    return path.relative_to(root).as_posix() if path != root else path.name


def _walk(folder: Path, depth: int, root: Path) -> Iterator[LocalModel]:
    if (folder / "config.json").is_file():
        yield LocalModel(_short(folder, root), str(folder), "folder", _size(folder.glob("*.safetensors")))
        return
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.suffix.lower() == ".gguf" and entry.is_file():
            yield LocalModel(_short(entry, root), str(entry), "gguf", _size([entry]))
        elif depth > 0 and entry.is_dir():
            yield from _walk(entry, depth - 1, root)


def _in_hf_cache() -> Iterator[LocalModel]:
    try:
        from huggingface_hub import scan_cache_dir

        cache = scan_cache_dir()
    except Exception:  # no cache yet, or one this version cannot read: nothing listed from it
        return
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        if any(f.file_name == "config.json" for rev in repo.revisions for f in rev.files):
            yield LocalModel(repo.repo_id, repo.repo_id, "huggingface", repo.size_on_disk)


def _in_ollama(store: Path) -> Iterator[LocalModel]:
    """Ollama's manifests (``manifests/<host>/<namespace>/<name>/<tag>``), each naming its
    weights' blob: a GGUF file under ``blobs/``."""
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, name, tag = manifest.relative_to(manifests).parts
        try:
            layers = json.loads(manifest.read_text()).get("layers") or []
        except (OSError, ValueError):
            continue
        digest = next((layer.get("digest") for layer in layers
                       if layer.get("mediaType") == "application/vnd.ollama.image.model"), None)
        blob = store / "blobs" / str(digest).replace(":", "-") if digest else None
        if blob is None or not blob.is_file():
            continue
        short = f"{name}:{tag}" if namespace == "library" and host == "registry.ollama.ai" else \
            f"{namespace}/{name}:{tag}"
        yield LocalModel(short, str(blob), "ollama", _size([blob]))


def _size(files: object) -> int:
    total = 0
    for path in files:  # type: ignore[attr-defined]
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total
