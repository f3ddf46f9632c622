"""What every linear our kernel library computes shares: the base class (``KernelLinear``), the
group of 32 inputs the integer formats quantize by, the bias copy the kernels hold, and building
a weight from its rows a chunk at a time.

The int4, int8, float32 and bfloat16 linears (``int4_linear``, ``int8_linear``,
``float_linear``) and the embeddings that read a tied head's blocks (``int8_embedding``,
``float_embedding``) take these from here, so no format's module is another's base.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

GROUP = 32  # inputs a group of the integer formats (q4_0's and q8_0's block): one scale each
CHUNK_ROWS = 1024  # rows ``from_rows`` quantizes at a time: whole blocks, ~4 MB of float32 at a 1k width

# ``rows(first, stop)``: a weight's float rows ``first:stop``, read from a checkpoint, say.
RowReader = Callable[[int, int], torch.Tensor]


def row_chunks(n: int) -> Iterator[tuple[int, int]]:
    """``(first, stop)`` of each chunk of ``CHUNK_ROWS`` rows of ``n``."""
    return ((first, min(first + CHUNK_ROWS, n)) for first in range(0, n, CHUNK_ROWS))


def own_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """A float32 copy of a linear's bias for our kernels: they hold its address, and the model's
    own bias may be a view of the checkpoint's memory map."""
    return None if bias is None else bias.detach().to(torch.float32, copy=True).contiguous()


class KernelLinear(nn.Module):
    """A linear our kernel library computes: its weights' addresses are fixed at construction
    (``_weights``, as ``JointLinears`` passes them; ``_joint``, a joint of this one alone), float32
    in and out, another dtype in and out as itself."""

    JOINT: str  # the kernel function JointLinears calls for a joint of these
    BITS: int  # the same function as decode_layers.c's run() picks it (joint_args.bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return self._joint(x.float().contiguous()).to(x.dtype)
        return self._joint(x)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        """``model.to()``, ``.half()`` and the like leave the weights as they are: the kernel
        holds their addresses, and its format is fixed."""
        return self
