"""Checkpoints their authors quantized with GPTQ or AWQ (``quantization_config``'s
``quant_method`` "gptq" or "awq", as Qwen's own ``-GPTQ-Int4`` and ``-AWQ`` repositories are),
read straight into our kernels' forms on the CPU, without the library transformers would need
for them (``gptqmodel``).

Both store, for each output and each group of ``group_size`` inputs, 4-bit values ``q``, a
float16 ``scale`` and a 4-bit zero point ``z``: ``w = (q - z) * scale``. Our int4's min form
is ``w = q * scale + min`` in groups of 32 (``int4_linear``, as GGUF's q4_1): ``min = -z * scale``,
and a group of 128 is four of ours sharing a scale. What differs is how int32 words hold the
nibbles (value j of a word in bits 4j..4j+3):

- GPTQ: ``qweight`` [K/8, N], eight inputs a word; ``qzeros`` [K/G, N/8], eight outputs a
  word, each stored one less than it is in the first format (``checkpoint_format`` "gptq";
  "gptq_v2" stores them as they are); ``g_idx`` [K] names each input's group. Act-order
  checkpoints (``desc_act``) shuffle ``g_idx``: their groups are not runs of inputs, so those
  weights are dequantized and quantized again in ours (``int4_linear.quantize``). GPTQ's 8-bit
  form packs four values a word the same way and becomes our int8 (q8_0's groups of 32).
- AWQ (the "gemm" version): ``qweight`` [K, N/8] and ``qzeros`` [K/G, N/8], eight outputs a
  word in the order 0 2 4 6 1 3 5 7.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..cpu import kernels
from ..cpu.int4_linear import GROUP, Int4Linear
from ..cpu.int8_linear import Q8Linear
from ..cpu.model_linears import INT4_KERNELS, Q8_KERNELS

_AWQ_UNORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # output j of a word is at value _AWQ_UNORDER[j]


@dataclass(frozen=True)
class Prequantized:
    """A checkpoint's GPTQ or AWQ settings, as ``of`` read them."""

    method: str  # "gptq" | "awq"
    group: int  # inputs one scale covers (0: a whole row)
    zeros_one_less: bool  # GPTQ's first format
    bits: int = 4  # 4, or 8 (GPTQ's Int8: our int8)

    def kernels(self, count: int) -> str:
        """What ``count`` linears read from the checkpoint run on (``infer/status``)."""
        ours = f"{INT4_KERNELS}, with zero points" if self.bits == 4 else Q8_KERNELS
        return f"from {self.method.upper()}: {ours} x{count}"

    def linear(self, read: Callable[[str], torch.Tensor], names: Container[str], prefix: str,
               bias: torch.Tensor | None) -> nn.Module:
        """The linear ``prefix`` (``model.layers.0.mlp.up_proj``) as our int4 (int8 for 8-bit
        GPTQ), from its ``qweight``, ``qzeros``, ``scales`` (and GPTQ's ``g_idx``, where
        ``names`` has it)."""
        packed, zeros, scales = read(f"{prefix}.qweight"), read(f"{prefix}.qzeros"), read(f"{prefix}.scales")
        if self.method == "gptq":
            q = _unpack(packed, 0, self.bits)  # [K, N]
            z = _unpack(zeros, 1, self.bits).to(torch.int16) + int(self.zeros_one_less)
        else:
            q = _awq_order(_unpack(packed, 1, 4))
            z = _awq_order(_unpack(zeros, 1, 4)).to(torch.int16)
        k, n = q.shape
        group = self.group or k
        groups = torch.arange(k) // group
        g_idx = read(f"{prefix}.g_idx").long() if f"{prefix}.g_idx" in names else groups
        if self.bits == 8 or not torch.equal(g_idx, groups):
            # 8 bits: our int8 (q8_0's groups of 32) from the weight, ~exact. Act-order: groups
            # that are not runs of inputs, quantized again in ours.
            weight = ((q.float() - z[g_idx].float()) * scales[g_idx].float()).t().contiguous()
            return (Q8Linear if self.bits == 8 else Int4Linear).from_weight(weight, bias)
        if k % group or scales.shape != (k // group, n) or z.shape != scales.shape:  # (take() checked the group)
            raise ValueError(f"{prefix}: a {self.method.upper()} layer of {k} inputs and {n} outputs does not match "
                             f"its scales {tuple(scales.shape)} and zero points {tuple(z.shape)} in groups of {group}")
        repeat = group // GROUP
        scale = scales.t().float().repeat_interleave(repeat, dim=1)  # [N, K/32]
        low_min = (-z.t().float() * scales.t().float()).repeat_interleave(repeat, dim=1)
        return Int4Linear(_row_nibbles(q.t()), scale.half(), low_min.half(), bias)


def take(config: Any, folder: object) -> Prequantized | None:
    """``of(config)``, its ``quantization_config`` taken off the config (the model built from it
    is ours, not transformers' quantized one); ``ValueError`` naming ``folder`` where our
    kernels cannot hold it."""
    settings = of(config)
    if settings is None:
        return None
    if settings.group % GROUP:
        raise ValueError(f"{folder}: its {settings.method.upper()} groups of {settings.group} inputs do not "
                         f"split into our groups of {GROUP}")
    if (reason := kernels.unavailable()) is not None:  # int8 is in the same library
        raise ValueError(f"{folder}: its {settings.method.upper()} weights need our int4/int8 kernels, which "
                         f"cannot run here: {reason}")
    del config.quantization_config
    return settings


def of(config: Any) -> Prequantized | None:
    """The GPTQ (4 or 8 bits) or AWQ (4 bits) settings of a checkpoint's config; None where it
    has none, or another method, width or layout (transformers' own quantizer reads those,
    where its library is installed)."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    settings = settings if isinstance(settings, dict) else settings.to_dict()
    method = str(settings.get("quant_method", "")).lower()
    bits = settings.get("bits", settings.get("w_bit"))
    if method not in ("gptq", "awq") or bits not in ((4, 8) if method == "gptq" else (4,)):
        return None
    if method == "awq" and (str(settings.get("version", "gemm")).lower() != "gemm"
                            or not settings.get("zero_point", True)):
        return None
    layout = str(settings.get("checkpoint_format", "gptq")).lower()
    if method == "gptq" and layout not in ("gptq", "gptq_v2"):
        return None
    group = int(settings.get("group_size", settings.get("q_group_size", 128)))
    return Prequantized(method, max(group, 0), method == "gptq" and layout == "gptq", bits)


def quantized_names(files: Iterable[str]) -> set[str]:
    """The ``.weight`` names a GPTQ/AWQ checkpoint holds as ``.qweight`` instead."""
    return {f"{name.removesuffix('.qweight')}.weight" for name in files if name.endswith(".qweight")}


def _unpack(words: torch.Tensor, along: int, bits: int) -> torch.Tensor:
    """int32 words of 32/``bits`` values, unpacked along dim ``along`` (uint8, that many times
    as long)."""
    words, per = words.to(torch.int32), 32 // bits
    shifts, mask = torch.arange(0, 32, bits, dtype=torch.int32), (1 << bits) - 1
    if along == 0:
        values = (words.unsqueeze(1) >> shifts.view(1, per, 1)) & mask
        return values.reshape(-1, words.shape[1]).to(torch.uint8)
    values = (words.unsqueeze(2) >> shifts.view(1, 1, per)) & mask
    return values.reshape(words.shape[0], -1).to(torch.uint8)


def _awq_order(values: torch.Tensor) -> torch.Tensor:
    """AWQ's unpacked columns (each word's outputs 0 2 4 6 1 3 5 7) in output order."""
    rows = values.shape[0]
    return values.view(rows, -1, 8)[:, :, _AWQ_UNORDER].reshape(rows, -1)


def _row_nibbles(q: torch.Tensor) -> torch.Tensor:
    """4-bit values [N, K] in our row form: each group of 32 is 16 bytes, byte j holding value
    j (low nibble) and value j + 16 (high), as GGUF's q4 blocks."""
    n, k = q.shape
    halves = q.contiguous().view(n, k // GROUP, 2, GROUP // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
