"""Quantized weights kept on disk, so that a second start does not quantize again.

Quantizing a checkpoint to our int4 (or int8) is nearly all of a first load (a 0.36 B model:
~43 s of ~43 s on 2 cores); the result depends only on the checkpoint's bytes, the format and
our layout. It is written once, after a load that quantized, to
``~/.cache/jupyter_infer/weights/<key>/`` (``JUPYTER_INFER_CACHE`` moves the root), one
safetensors file a linear holding its kernel's blocks as they are, and read back on the next
start straight into the huge pages the kernels stream (one read a tensor: no reordering, no
memory map to fault through, no second copy).

The key covers every checkpoint file's name, size and modification time, the format, the
dtype, torch's version and ``LAYOUT`` (bumped whenever what is stored, or how our kernels read
it, changes), so a changed checkpoint or a new layout is another key: never a stale hit. A
cache is only used when its marker (written last, after every file is whole) lists it, each
file has the size the marker says and each stored linear the shape the model expects; anything
else is removed and the load quantizes, then writes it anew. Old entries are not pruned;
``infer/status`` names the one in use and its size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..cpu import weight_arena
from ..cpu.int4_linear import Int4Linear
from ..cpu.int8_linear import Q8Linear

log = logging.getLogger(__name__)
LAYOUT = 2  # bump when what a stored linear holds (the kernels' blocks) or how we quantize changes
# The tensors a stored linear's kernel streams: read straight into huge pages (weight_arena).
_STREAMED = frozenset({"blocks", "packed", "scales", "mins"})
_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "BF16": torch.bfloat16,
           "F32": torch.float32, "I64": torch.int64, "I32": torch.int32}
MARKER = "complete.json"  # written last: the names, kinds and files of every stored linear


def cache_root() -> Path:
    return Path(os.environ.get("JUPYTER_INFER_CACHE") or Path.home() / ".cache" / "jupyter_infer") / "weights"


def key_of(files: Iterable[Path], quantize: str, dtype: torch.dtype) -> str:
    """The cache key of a checkpoint (its files) read into ``quantize`` at ``dtype``: each
    file's resolved path, size and modification time, and what it says of itself without
    reading its weights (a safetensors header: every tensor's name, dtype, shape and offsets;
    a small file, such as config.json, whole). Two copies of one model whose times were kept
    (``cp -a``) are then two keys, never one serving the other's weights."""
    digest = hashlib.sha256(f"layout {LAYOUT} {quantize} {dtype} torch {torch.__version__}".encode())
    for path in sorted({p.resolve() for p in files}):
        stat = path.stat()
        digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}\n".encode())
        digest.update(_self_description(path, stat.st_size))
    return digest.hexdigest()[:24]


def _self_description(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        if path.suffix == ".safetensors" and size >= 8:
            length = int.from_bytes(f.read(8), "little")
            return f.read(min(length, 100 << 20))
        return f.read() if size <= 1 << 20 else b""


class WeightCache:
    """One checkpoint's quantized linears: ``get`` a stored one (None: build it and ``put`` it),
    ``finish`` once every linear is built. Each linear built here is written as it comes (one
    safetensors file each), so the cache never holds a second copy of the model in memory."""

    def __init__(self, key: str, source: str) -> None:
        self.dir = cache_root() / key
        self.source = source
        self.hit = False
        self._stored: dict[str, dict[str, Any]] = {}  # name -> {"file", "kind", "bytes"}
        self._staging: Path | None = None
        self._written: dict[str, dict[str, Any]] = {}
        self._writable = True
        _sweep(self.dir.parent)
        self._read()

    def _read(self) -> None:
        marker = self.dir / MARKER
        if not marker.is_file():
            if self.dir.exists():
                shutil.rmtree(self.dir, ignore_errors=True)  # a write that never finished
            return
        try:
            meta = json.loads(marker.read_text())
            if meta.get("layout") != LAYOUT:
                raise ValueError(f"layout {meta.get('layout')}, not {LAYOUT}")
            for entry in meta["linears"].values():
                size = (self.dir / entry["file"]).stat().st_size
                if size != entry["bytes"]:
                    raise ValueError(f"{entry['file']} is {size} bytes, the marker says {entry['bytes']}")
            self._stored, self.hit = meta["linears"], True
        except Exception as err:  # truncated, missing, unreadable: rebuilt, never served
            log.warning("jupyter_infer: the weight cache %s cannot be used (%s); quantizing again", self.dir, err)
            self.drop()

    def get(self, name: str, shape: tuple[int, int]) -> nn.Module | None:
        """The stored linear ``name`` of ``shape`` ([out, in]), built from the cache; None when
        there is none (or it does not fit: then the whole cache is dropped)."""
        entry = self._stored.get(name)
        if entry is None:
            if self.hit:  # a cache that lacks one of the model's linears: not this model's
                self._give_up(f"it has no {name}")
            return None
        try:
            module = _build(entry["kind"], _read_placed(self.dir / entry["file"]))
            if (module.out_features, module.in_features) != tuple(shape):
                raise ValueError(f"{name} is stored as {module.out_features}x{module.in_features}, not {shape}")
        except Exception as err:
            self._give_up(str(err))
            return None
        return module

    def _give_up(self, why: str) -> None:
        """A cache found wrong half-way: removed, and nothing written this load (the linears
        read from it so far would be missing); the next start quantizes and writes it whole."""
        log.warning("jupyter_infer: the weight cache %s does not fit the model (%s); quantizing again", self.dir, why)
        self.drop()
        self._writable = False

    def put(self, name: str, module: nn.Module) -> None:
        """Write ``module`` (built here) to the cache being made; others than ours quantized
        are not kept (float linears are the checkpoint's own bytes)."""
        if self.hit or not self._writable:
            return
        found = _tensors(module)
        if found is None:
            return
        kind, tensors = found
        if self._staging is None:
            self.dir.parent.mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=self.dir.parent))
        file = f"{len(self._written):05d}.safetensors"
        try:
            save_file(tensors, self._staging / file)
        except OSError as err:  # a full or read-only disk: no cache this time
            log.warning("jupyter_infer: could not write the weight cache (%s)", err)
            self._abandon()
            return
        self._written[name] = {"file": file, "kind": kind, "bytes": (self._staging / file).stat().st_size}

    def drop(self) -> None:
        self._stored, self.hit = {}, False
        shutil.rmtree(self.dir, ignore_errors=True)

    def finish(self) -> None:
        """Make what was written here the cache (atomically: the marker last, then a rename)."""
        staging, self._staging = self._staging, None
        if staging is None or not self._written:
            return
        meta = {"source": self.source, "layout": LAYOUT, "written_at": time.time(), "linears": self._written}
        try:
            (staging / MARKER).write_text(json.dumps(meta, indent=1))
            shutil.rmtree(self.dir, ignore_errors=True)
            os.replace(staging, self.dir)
        except OSError as err:
            log.warning("jupyter_infer: could not write the weight cache %s (%s)", self.dir, err)
            shutil.rmtree(staging, ignore_errors=True)
            return
        log.info("jupyter_infer | weight cache written: %s (%d linears)", self.dir, len(self._written))

    def _abandon(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        self._staging, self._written, self._writable = None, {}, False

    def status(self) -> dict[str, Any]:
        """For ``infer/status``: where it is, whether this load came from it, its size."""
        size = sum(f.stat().st_size for f in self.dir.glob("*.safetensors")) if self.dir.is_dir() else None
        return {"dir": str(self.dir), "hit": self.hit, "bytes": size}


def _tensors(module: nn.Module) -> tuple[str, dict[str, torch.Tensor]] | None:
    """A linear of ours as it is stored: its kernel's blocks as they are, and its shape."""
    if not isinstance(module, (Int4Linear, Q8Linear)):
        return None
    bias = {"bias": module.bias} if module.bias is not None else {}
    shape = {"shape": torch.tensor([module.out_features, module.in_features])}
    if isinstance(module, Int4Linear):
        mins = {"mins": module.mins} if module.mins is not None else {}
        return "int4", {"blocks": module.blocks, "scales": module.scales, **mins, **shape, **bias}
    return "int8", {"packed": module.packed, "scales": module.scales, **shape, **bias}


def _build(kind: str, t: dict[str, torch.Tensor]) -> nn.Module:
    out_features, in_features = (int(v) for v in t["shape"])
    if kind == "int4":
        return Int4Linear(t["blocks"], t["scales"], t.get("mins"), t.get("bias"),
                          shape=(out_features, in_features), placed=True)
    if kind == "int8":
        return Q8Linear(t["packed"], t["scales"], out_features, in_features, t.get("bias"), placed=True)
    raise ValueError(f"a stored linear of kind {kind!r}")


def _read_placed(path: Path) -> dict[str, torch.Tensor]:
    """A stored linear's tensors, the streamed ones read straight into huge pages: one read
    each from the file (safetensors: a length, a JSON header, the bytes), with no memory map
    to fault through and no second copy. A short file raises (the cache is then rebuilt)."""
    out = {}
    with open(path, "rb", buffering=0) as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape, (start, end) = info["shape"], info["data_offsets"]
            dtype = _DTYPES[info["dtype"]]
            tensor = weight_arena.empty(shape, dtype) if name in _STREAMED else torch.empty(shape, dtype=dtype)
            view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
            if len(view) != end - start:
                raise ValueError(f"{path.name}: {name} is {end - start} bytes, not {len(view)}")
            f.seek(8 + length + start)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise ValueError(f"{path.name} ends inside {name}")
                done += got
            out[name] = tensor
    return out


def _sweep(root: Path, older_than_s: float = 3600.0) -> None:
    """Remove what loads that never finished left (``.writing-*`` folders an hour old)."""
    for staging in root.glob(".writing-*") if root.is_dir() else ():
        try:
            if time.time() - staging.stat().st_mtime > older_than_s:
                shutil.rmtree(staging, ignore_errors=True)
        except OSError:
            pass
