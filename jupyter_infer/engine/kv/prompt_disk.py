"""The prefix cache's blocks on disk, so that a restart or a switch back to a model does not
compute its prompts again.

Every block the prefix cache keeps is also written here (by a background thread: a step never
waits on the disk), one file a block, named by its chain key, under
``~/.cache/jupyter_infer/prompts/<model key>/`` (``JUPYTER_INFER_CACHE`` moves the root). The
model key covers the checkpoint's files as the weight cache's key does, the quantization and
kernels (int4 weights give other keys and values than float ones) and the KV's shape and
dtype. A lookup that misses in memory reads the chain on from here, block by block.

A file is served only when all of it agrees: its magic, the model key, its chain key, its
tokens, the shape and dtype expected, and the CRC-32 of its bytes (what a torn write or a
flipped bit changes; the folder is the user's own, so no adversary's hash is needed, and at
~4 GB/s against BLAKE2's ~0.9 the check of a 3k-token prompt's 77 MB is ~20 ms, not ~90). Anything else (a truncated
write, a flipped bit, another model's file) is deleted and counted as ``rejected``; the prompt
is then computed and its blocks written anew. The folder is bounded in bytes, least recently
used files (their modification time, set on every read) out first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..._version import __version__

log = logging.getLogger(__name__)
MAGIC = b"JIKV\x02"  # the format's version is its last byte: bump it when a file's layout changes
SUFFIX = ".kvb"
# Bytes of blocks waiting for the writer (each held until written): past this, the newest are
# not written (counted as ``skipped``), so that a slow disk never holds the engine back nor
# holds memory. 256 MB is ~10k tokens of the 0.5b shape's float32 KV, ~2k of an 8B's; a
# prompt's prefill on a CPU takes far longer than writing its blocks to the page cache.
MAX_PENDING_BYTES = 256 * 2**20
CLOSE_WAIT_S = 10.0  # what a stop (a restart, a model switch) waits at most for queued writes
STALE_WRITE_S = 300.0  # a temporary file this old is an interrupted write's, not a live one's
HEADER_MAX = 1 << 20  # a block file's header is its tokens and a few fields: far less than this


def prompts_root() -> Path:
    return Path(os.environ.get("JUPYTER_INFER_CACHE") or Path.home() / ".cache" / "jupyter_infer") / "prompts"


def model_key(files: Iterable[Path], quantize: str, kernels: str, block_shape: Sequence[int],
              dtype: torch.dtype) -> str:
    """The folder of one model's blocks: its files' paths, sizes and modification times (a
    checkpoint changed in place is another key), how its forward computes (``kernels``: its
    linears, forward path, prompt attention, kernel build), the KV's form, and our version and
    torch's (either may change how a key or value is computed)."""
    digest = hashlib.sha256(f"{MAGIC!r} {__version__} {quantize} {kernels} {list(block_shape)} {dtype} "
                            f"torch {torch.__version__}".encode())
    for path in sorted({p.resolve() for p in files}):
        stat = path.stat()
        digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


class DiskBlocks:
    """One model's blocks on disk: ``read`` one back (None when absent or refused), ``write``
    one (queued), at most ``capacity_bytes`` of files."""

    def __init__(self, folder: Path, key: str, capacity_bytes: int, block_shape: Sequence[int],
                 dtype: torch.dtype) -> None:
        self.dir, self.key, self.capacity_bytes = folder, key, capacity_bytes
        self.shape, self.dtype = tuple(int(n) for n in block_shape), dtype
        self.block_bytes = torch.Size(self.shape).numel() * torch.tensor([], dtype=dtype).element_size()
        self.hits = self.read_tokens = self.written = self.rejected = self.skipped = self.failed = 0
        self._lock = threading.Lock()  # the index: the engine reads and evicts, the writer adds
        self._files: OrderedDict[bytes, int] = OrderedDict()  # chain key -> file bytes, oldest first
        self.used_bytes = 0
        self._pending: queue.Queue[tuple[bytes, tuple[int, ...], torch.Tensor] | None] = queue.Queue(
            max(1, MAX_PENDING_BYTES // self.block_bytes))
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._index()
        self._writer = threading.Thread(target=self._write_loop, name="jupyter-infer-prompt-disk", daemon=True)
        self._writer.start()

    def _index(self) -> None:
        """What an earlier process left: every whole file, oldest use first; leftovers of an
        interrupted write are removed."""
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.startswith(".writing-"):
                try:  # another process's write in flight is young: only an interrupted one's is old
                    if time.time() - entry.stat().st_mtime > STALE_WRITE_S:
                        _unlink(Path(entry.path))
                except OSError:
                    pass
            elif entry.name.endswith(SUFFIX):
                try:
                    key, stat = bytes.fromhex(entry.name.removesuffix(SUFFIX)), entry.stat()
                except (ValueError, OSError):
                    continue
                found.append((stat.st_mtime_ns, key, stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self.used_bytes += size
        self._evict()

    def read(self, key: bytes, tokens: Sequence[int]) -> torch.Tensor | None:
        """The block of chain ``key`` holding ``tokens``, or None (absent, gone, or refused)."""
        if key not in self._files:
            return None
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.block_bytes + HEADER_MAX:
                    return self._refuse(key, f"{size} bytes, more than a block")
                data = bytearray(size)  # read once, into the tensor's own memory
                if f.readinto(data) != len(data):
                    return self._refuse(key, "it changed while read")
        except FileNotFoundError:  # another process sharing the folder evicted it
            self._forget(key)
            return None
        except OSError as err:
            return self._refuse(key, f"unreadable ({err})")
        try:
            kv, why = self._parse(data, key, tokens)
        except Exception as err:  # noqa: BLE001 - whatever a damaged file holds, it is refused, not raised
            kv, why = None, f"unreadable ({type(err).__name__})"
        if kv is None:
            return self._refuse(key, why)
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        self.hits += 1
        self.read_tokens += len(tokens)
        return kv

    def _parse(self, data: bytearray, key: bytes, tokens: Sequence[int]) -> tuple[torch.Tensor | None, str]:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
            return None, "not a block file of this version"
        (length,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4 + length
        try:
            head = json.loads(data[len(MAGIC) + 4 : start])
        except ValueError:
            return None, "its header is not JSON"
        if not isinstance(head, dict):
            return None, "its header is not an object"
        payload = memoryview(data)[start:]
        checks = [
            (head.get("model") == self.key, "another model's block"),
            (head.get("key") == key.hex(), "its chain key is not its name"),
            (head.get("tokens") == list(tokens), "other tokens"),
            (head.get("shape") == list(self.shape) and head.get("dtype") == str(self.dtype), "another shape or dtype"),
            (len(payload) == self.block_bytes, f"{len(payload)} bytes of KV, not {self.block_bytes}"),
            (zlib.crc32(payload) == head.get("crc32"), "its bytes changed"),
        ]
        for ok, why in checks:
            if not ok:
                return None, why
        if start % 64:  # not as we write them
            return None, "its KV is not aligned"
        return torch.frombuffer(data, dtype=self.dtype, offset=start).view(self.shape), ""

    def _refuse(self, key: bytes, why: str) -> None:
        log.warning("jupyter_infer: prompt cache file %s refused (%s); its prompt is computed again",
                    self._path(key).name, why)
        self.rejected += 1
        self._forget(key)
        _unlink(self._path(key))

    def _forget(self, key: bytes) -> None:
        with self._lock:
            size = self._files.pop(key, None)
            if size is not None:
                self.used_bytes -= size

    def write(self, key: bytes, tokens: Sequence[int], kv: torch.Tensor) -> None:
        """Keep a block (not already kept) on disk, soon; dropped when the writer is behind.
        ``kv`` is not copied: the prefix cache never changes a block it holds."""
        if key in self._files or tuple(kv.shape) != self.shape or kv.dtype != self.dtype:
            return
        try:
            self._pending.put_nowait((key, tuple(tokens), kv))
        except queue.Full:
            self.skipped += 1

    def flush(self) -> None:
        """Wait until every queued block is written (``close`` also does, then stops the writer)."""
        self._pending.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        try:
            self._pending.put(None, timeout=CLOSE_WAIT_S)
        except queue.Full:  # a disk that hangs: the blocks still queued are dropped with the thread
            return
        self._writer.join(timeout=CLOSE_WAIT_S)

    def _write_loop(self) -> None:
        while True:
            item = self._pending.get()
            try:
                if item is None:
                    return
                self._write_one(*item)
            except Exception as err:  # a full or read-only disk: this block is not kept
                self.failed += 1
                if self.failed == 1:  # once: a full disk would say it for every block
                    log.warning("jupyter_infer: could not write a prompt cache block to %s (%s); "
                                "blocks that cannot be written stay in memory only", self.dir, err)
            finally:
                self._pending.task_done()

    def _write_one(self, key: bytes, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        if key in self._files:
            return
        payload = kv.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        head = json.dumps({"model": self.key, "key": key.hex(), "tokens": list(tokens), "shape": list(self.shape),
                           "dtype": str(self.dtype),
                           "crc32": zlib.crc32(payload)}).encode()
        head += b" " * (-(len(MAGIC) + 4 + len(head)) % 64)  # the KV starts 64-byte aligned in the file
        fd, tmp = tempfile.mkstemp(prefix=".writing-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(head)) + head)
                f.write(payload)
            os.replace(tmp, self._path(key))  # whole or absent: a reader never sees half a file
        except BaseException:
            _unlink(Path(tmp))
            raise
        size = len(MAGIC) + 4 + len(head) + len(payload)
        with self._lock:
            self._files[key] = size
            self.used_bytes += size
        self.written += 1
        self._evict()

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self.used_bytes <= self.capacity_bytes or not self._files:
                    return
                key, size = self._files.popitem(last=False)
                self.used_bytes -= size
            _unlink(self._path(key))

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{key.hex()}{SUFFIX}"

    def stats(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "dir": str(self.dir),
            "capacity_mb": round(self.capacity_bytes / 2**20, 3),
            "used_mb": round(self.used_bytes / 2**20, 3),
            "blocks": len(self._files),
            "hits": self.hits,  # blocks read back
            "read_tokens": self.read_tokens,
            "written_blocks": self.written,
            "rejected": self.rejected,  # files refused (corrupt, foreign) and deleted
            "skipped": self.skipped,  # blocks not written: the writer was behind
            "failed": self.failed,  # blocks the disk refused (full, read-only)
        }


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
