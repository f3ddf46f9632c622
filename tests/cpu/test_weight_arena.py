"""Huge-page memory for streamed weights (cpu/weight_arena.py): a placed tensor is an
independent, aligned copy, placements never overlap, and where Linux gives transparent huge
pages on request the weights sit in them."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch

from jupyter_infer.cpu import weight_arena

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_placed_tensors_are_aligned_independent_copies_that_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_arena, "CHUNK", 1 << 20)  # small chunks: placements cross into new ones
    monkeypatch.setattr(weight_arena, "_chunk", None)  # (restored with its fill after the test)
    monkeypatch.setattr(weight_arena, "_used", 0)
    sources = [torch.randn(37, 11), torch.randint(0, 255, (1001,), dtype=torch.uint8),
               torch.randn(300, 200).half(), torch.randn(3, (1 << 18) + 5), torch.randn(1000)]  # the fourth needs a chunk of its own
    placed = [weight_arena.place(t) for t in sources]
    for source, copy in zip(sources, placed, strict=True):
        assert copy.dtype == source.dtype and copy.shape == source.shape and copy.is_contiguous()
        assert copy.data_ptr() % weight_arena.ALIGN == 0 and torch.equal(copy, source)
    sources[0].zero_()  # a copy, not a view
    assert placed[0].abs().sum() > 0
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in placed)
    assert all(end <= start for (_, end), (start, _) in pairwise(spans))
    assert weight_arena.place(torch.empty(0, 4)).shape == (0, 4)


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_weights_sit_in_huge_pages_where_linux_gives_them() -> None:
    weight = weight_arena.place(torch.ones(8 << 20, dtype=torch.uint8))  # 8 MB: several aligned 2 MB pages
    address, huge_kb, inside = weight.data_ptr(), 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
            start, end = (int(a, 16) for a in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            huge_kb = int(line.split()[1])
    assert huge_kb >= 2048, "the placed weight's mapping holds no huge page"
