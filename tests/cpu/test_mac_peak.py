"""The machine's measured multiply-add peak (cpu/mac_peak.py, csrc/peak.c) is a ceiling: no kernel of
ours runs above it, int8 products outrun float32 ones, and the bench prints each kind's share."""

from __future__ import annotations

import pytest
import torch

from jupyter_infer.commands.bench import peak as bench_peak
from jupyter_infer.cpu import kernels, mac_peak

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason="our CPU kernels do not build here")


def test_the_peak_is_a_ceiling_our_linears_stay_under() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: steadier on a shared machine, and the same for both
    try:
        int8, float32 = mac_peak.peak_gmacs("int8", 0.05), mac_peak.peak_gmacs("float32", 0.05)
        ours = mac_peak.linear_gmacs("int8", 64, shapes=((256, 512),))
    finally:
        torch.set_num_threads(threads)
    # An int8 dot instruction does at least as many multiply-adds as a float32 FMA (4x on VNNI).
    assert int8 > float32 > 0
    assert ours < 1.1 * int8  # a loop the compiler folded away would read as a tiny peak


def test_the_bench_prints_each_kinds_share_of_its_peak() -> None:
    entry = {"machine": {"int8": 400.0, "bfloat16": 200.0, "float32": 100.0},
             "linears": {"int4": {64: 300.0}, "int8": {64: 200.0}, "bfloat16": {64: 150.0}, "float32": {64: 90.0}}}
    text = bench_peak.table(entry)
    assert "int4" in text and "300 (75%)" in text and "150 (75%)" in text and "90 (90%)" in text
    assert "not measured: no kernels" in bench_peak.table({"error": "no kernels"})
