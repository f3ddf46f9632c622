"""The prefix cache's blocks on disk: a restarted engine finds its prompts there, gives the
same tokens as a cold one, and never serves a corrupt, truncated or foreign file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from jupyter_infer.engine.hf import HFEngine
from jupyter_infer.engine.kv.prefix_cache import BLOCK_TOKENS, PrefixCache, chain_keys
from jupyter_infer.engine.kv.prompt_disk import MAGIC, SUFFIX, DiskBlocks, prompts_root
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

SHAPE = (2, 2, 1, BLOCK_TOKENS, 4)
TOOL_PROMPT = ("You are an agent in a notebook. Tools: search(query), run_cell(code), read_file(path). "
               "Call one tool at a time and say why. ") * 6 + "Task: find the slowest cell."


def disk(folder: Path, key: str = "model-a", megabytes: float = 1.0) -> DiskBlocks:
    return DiskBlocks(folder, key, int(megabytes * 2**20), SHAPE, torch.float32)


def kv_of(tokens: list[int]):
    return lambda a, b: torch.arange(a, b, dtype=torch.float32).repeat(2, 2, 1, 4, 1).transpose(-1, -2) + tokens[0]


def fill(folder: Path, tokens: list[int], **kwargs) -> PrefixCache:
    cache = PrefixCache(2**20, disk=disk(folder, **kwargs))
    cache.insert(tokens, len(tokens), kv_of(tokens))
    cache.disk.close()
    return cache


def test_blocks_written_by_one_cache_are_read_by_the_next(tmp_path: Path) -> None:
    tokens = list(range(100, 100 + 3 * BLOCK_TOKENS + 5))
    first = fill(tmp_path, tokens)
    assert first.stats()["disk"]["written_blocks"] == 3

    again = PrefixCache(2**20, disk=disk(tmp_path))  # a new process: memory empty
    length, kv = again.match(tokens)
    assert length == 3 * BLOCK_TOKENS and again.stats()["disk"]["hits"] == 3
    expected = torch.cat([kv_of(tokens)(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS) for i in range(3)], dim=3)
    assert torch.equal(kv, expected)
    assert again.match(tokens)[0] == 3 * BLOCK_TOKENS and again.stats()["disk"]["hits"] == 3  # memory now


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "another model's file", "not ours",
                                    "a header that is no object", "too large"])
def test_a_damaged_or_foreign_file_is_refused_deleted_and_never_served(tmp_path: Path, damage: str) -> None:
    tokens = list(range(7, 7 + 2 * BLOCK_TOKENS + 1))
    fill(tmp_path / "a", tokens)
    first = tmp_path / "a" / f"{chain_keys(tokens, 1)[0].hex()}{SUFFIX}"
    data = bytearray(first.read_bytes())
    if damage == "another model's file":  # the same prompt's block written for model-b, found here
        fill(tmp_path / "b", tokens, key="model-b")
        data = bytearray((tmp_path / "b" / first.name).read_bytes())
    elif damage == "flip a byte":
        data[-3] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "not ours":
        data = bytearray(b"<html>a proxy's error page</html>")
    elif damage == "a header that is no object":
        data = bytearray(MAGIC + struct.pack("<I", 3) + b"[1]" + bytes(data[-1000:]))
    elif damage == "too large":
        data += bytes(2 << 20)
    first.write_bytes(bytes(data))

    cache = PrefixCache(2**20, disk=disk(tmp_path / "a", megabytes=8))  # room for the large one: refused, not evicted
    assert cache.match(tokens) == (0, None)  # the chain's first block is refused: nothing reused
    stats = cache.stats()["disk"]
    assert stats["rejected"] == 1 and not first.exists()
    # Computed again, it is written anew, and read back whole by the next process.
    cache.insert(tokens, len(tokens), kv_of(tokens))
    cache.disk.close()
    assert first.exists()
    again = PrefixCache(2**20, disk=disk(tmp_path / "a"))
    assert again.match(tokens)[0] == 2 * BLOCK_TOKENS and again.stats()["disk"]["rejected"] == 0


def test_the_folder_stays_within_its_bytes_least_recently_used_out(tmp_path: Path) -> None:
    prompts = [list(range(1000 * i, 1000 * i + BLOCK_TOKENS + 1)) for i in range(1, 9)]
    store = disk(tmp_path, megabytes=1.0)
    cache = PrefixCache(2**20, disk=store)
    cache.insert(prompts[0], len(prompts[0]), kv_of(prompts[0]))
    store.flush()
    block_file = store.used_bytes
    store.capacity_bytes = 4 * block_file  # room for four blocks
    for p in prompts[1:4]:
        cache.insert(p, len(p), kv_of(p))
    store.flush()
    cache.clear()
    assert cache.match(prompts[0])[0] == BLOCK_TOKENS  # read back: now the most recent on disk
    for p in prompts[4:6]:
        cache.insert(p, len(p), kv_of(p))
    store.close()
    kept = {f.name for f in tmp_path.glob(f"*{SUFFIX}")}
    names = [f"{chain_keys(p, 1)[0].hex()}{SUFFIX}" for p in prompts]
    assert store.used_bytes <= store.capacity_bytes and len(kept) == 4
    assert kept == {names[0], names[3], names[4], names[5]}  # 1 and 2 were the least recently used


@pytest.fixture
def prompt_cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_INFER_CACHE", str(tmp_path))
    return prompts_root()


async def answer(model_dir: Path, prompt: str, **engine_options) -> tuple[list[int], dict]:
    """One greedy answer from a fresh engine (a new process would start the same way), then
    the service stopped as a server stops; the prefix cache's stats as they ended."""
    engine = HFEngine(str(model_dir), dtype="float32", num_threads=1, prefix_cache_mb=64, **engine_options)
    engine.text.eos_token_ids = frozenset()
    service = InferenceService(ServiceConfig(idle_admit_delay_ms=0), engine_loader=lambda: engine)
    service.start()
    await service.wait_ready()
    result = await (await service.submit(Request(prompt, SamplingParams(max_tokens=8)))).result()
    stats = service.prefix_cache()
    await service.stop()
    return result.token_ids, stats


@pytest.mark.asyncio
async def test_a_restarted_engine_reads_its_prompt_from_disk_and_answers_the_same(
        llama_model_dir: Path, prompt_cache_root: Path) -> None:
    cold, cold_stats = await answer(llama_model_dir, TOOL_PROMPT, prefix_cache_disk_mb=64)
    assert cold_stats["misses"] == 1 and cold_stats["disk"]["enabled"]
    folder = Path(cold_stats["disk"]["dir"])
    assert folder.parent == prompt_cache_root and len(list(folder.glob(f"*{SUFFIX}"))) > 4

    warm, warm_stats = await answer(llama_model_dir, TOOL_PROMPT, prefix_cache_disk_mb=64)
    assert warm == cold
    assert warm_stats["hits"] == 1 and warm_stats["disk"]["hits"] == warm_stats["reused_tokens"] // BLOCK_TOKENS > 4

    # Every file damaged: refused, the prompt computed again, the same answer.
    for f in folder.glob(f"*{SUFFIX}"):
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF  # a float's top byte, flipped: always another value
        f.write_bytes(bytes(data))
    again, again_stats = await answer(llama_model_dir, TOOL_PROMPT, prefix_cache_disk_mb=64)
    assert again == cold and again_stats["disk"]["rejected"] == 1 and again_stats["reused_tokens"] == 0

    # Off: nothing read nor written.
    off, off_stats = await answer(llama_model_dir, TOOL_PROMPT)
    assert off == cold and off_stats["disk"] == {"enabled": False} and off_stats["misses"] == 1


def test_a_full_disk_costs_the_disk_copy_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    import errno
    import os

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    tokens = list(range(50, 50 + 3 * BLOCK_TOKENS + 1))
    cache = PrefixCache(2**20, disk=disk(tmp_path))
    cache.insert(tokens, len(tokens), kv_of(tokens))
    cache.disk.flush()
    assert cache.match(tokens)[0] == 3 * BLOCK_TOKENS  # memory still serves
    stats = cache.stats()["disk"]
    assert stats["failed"] == 3 and stats["written_blocks"] == 0 and stats["blocks"] == 0
    assert not list(tmp_path.iterdir())  # no half-written file left behind
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1  # said once, not per block
