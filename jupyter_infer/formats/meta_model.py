"""Filling a model built on the meta device, tensor by tensor: the streamed loaders'
(``hf_load`` for safetensors, ``gguf_load`` for GGUF files) shared pieces."""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D


def linear_slots(lm: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Module]]:
    """Each linear's weight name -> (its parent, its attribute there, the linear); GPT-2's
    ``Conv1D`` counts (its weight is [in, out])."""
    out = {}
    for parent_name, parent in lm.named_modules():
        for attr, child in parent.named_children():
            if type(child) in (nn.Linear, Conv1D):
                prefix = f"{parent_name}.{attr}" if parent_name else attr
                out[f"{prefix}.weight"] = (parent, attr, child)
    return out


def in_features(linear: nn.Module) -> int:
    return linear.nx if type(linear) is Conv1D else linear.in_features


def put_tensor(root: nn.Module, name: str, value: torch.Tensor) -> None:
    """Set the parameter or buffer ``name`` (a parameter stays one, frozen)."""
    owner_name, _, attr = name.rpartition(".")
    owner = root.get_submodule(owner_name)
    if attr in owner._parameters:
        owner._parameters[attr] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[attr] = value


def init_missing_buffers(lm: nn.Module) -> bool:
    """Compute the buffers still on meta (RoPE's inverse frequencies: no checkpoint holds
    them) as transformers' own loading does, by the model's ``_init_weights`` of the module
    that owns them. False where such a module also owns parameters (they would be
    re-initialized): those buffers stay on meta."""
    done = True
    for owner_name in {name.rpartition(".")[0] for name, buf in lm.named_buffers() if buf.device.type == "meta"}:
        owner = lm.get_submodule(owner_name)
        if any(True for _ in owner.parameters(recurse=False)):
            done = False
            continue
        for attr, buf in list(owner._buffers.items()):
            if buf is not None and buf.device.type == "meta":
                owner._buffers[attr] = torch.empty_like(buf, device="cpu")
        lm._init_weights(owner)
    return done
