"""A decode step's decoder layers in one C call (``decode_layers.c``), for the Llama family
with our int4, int8, bfloat16 or float32 linears (``int4_linear``, ``int8_linear``, ``float_linear``), in
float32 (a bfloat16 checkpoint on the CPU is held so: ``hf_load``).

``LlamaForward`` with the C ops still called seven functions a layer from Python, with their
checks, views and the KV cache's bookkeeping: ~1 ms of a 0.5 B model's ~9 ms one-row step on a
2-core CPU, whose kernels are the rest. ``DecodeLayers`` builds every layer's arguments once
(weights, norms) and per step only points each layer at its cache buffers; the C loop then calls
the same functions in the same order, so the logits are the per-layer path's to the bit
(tests/engine/test_decode_layers.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ...cpu.joint_linears import JointLinears
from ...cpu.kernels import JointArgs, LayerArgs, library
from ...cpu.model_linears import OURS
from ..kv.kv_cache import GrowingLayer


def _joint(linears: list[nn.Module], keep: list[object]) -> JointArgs:
    joint = JointLinears(linears)
    keep.append(joint)  # its arrays are what the struct points at
    return joint.joint_args()


class DecodeLayers:
    """Every decoder layer of a decode step (one new token a row, one block) in one call."""

    def __init__(self, model: nn.Module) -> None:
        layers = model.model.layers
        a, mlp = layers[0].self_attn, layers[0].mlp
        config = a.config
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, a.head_dim
        self.hidden, self.intermediate = a.q_proj.in_features, mlp.down_proj.in_features
        self.scaling = float(a.scaling)
        self.cache_index = [layer.self_attn.layer_idx for layer in layers]
        self._keep: list[object] = []  # what the structs point at: joints' arrays, norm weights
        self._args = (LayerArgs * len(layers))()
        for args, layer in zip(self._args, layers, strict=True):
            a, mlp = layer.self_attn, layer.mlp
            norms = [n.weight.detach().float().contiguous() for n in (layer.input_layernorm, layer.post_attention_layernorm)]
            self._keep += norms
            args.qkv = _joint([a.q_proj, a.k_proj, a.v_proj], self._keep)
            args.o = _joint([a.o_proj], self._keep)
            args.gate_up = _joint([mlp.gate_proj, mlp.up_proj], self._keep)
            args.down = _joint([mlp.down_proj], self._keep)
            args.input_norm, args.post_norm = norms[0].data_ptr(), norms[1].data_ptr()
            if getattr(a, "q_norm", None) is not None:  # Qwen3's per-head norms
                heads = [n.weight.detach().float().contiguous() for n in (a.q_norm, a.k_norm)]
                self._keep += heads
                args.q_norm, args.k_norm = heads[0].data_ptr(), heads[1].data_ptr()
                args.head_eps = float(a.q_norm.variance_epsilon)
            args.input_eps = float(layer.input_layernorm.variance_epsilon)
            args.post_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self._run = library().ji_decode_layers

    @classmethod
    def of(cls, model: nn.Module) -> DecodeLayers | None:
        """One call for ``model``'s layers where each is the plain Llama layer with our int4, int8
        or float32 linears, one kind a joint (Qwen3's per-head q/k norms with one eps included), all of
        one shape; else ``None``."""
        layers = model.model.layers
        if not len(layers) or model.model.norm.weight.dtype != torch.float32:
            return None
        first = layers[0].self_attn
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if (not all(_grouped(joint) for joint in (linears[:3], linears[3:4], linears[4:6], linears[6:]))
                    or not _head_norms_fit(a)
                    or a.head_dim != first.head_dim or a.scaling != first.scaling or a.head_dim % 8
                    or a.q_proj.out_features != first.q_proj.out_features
                    or a.k_proj.out_features != first.k_proj.out_features
                    or mlp.down_proj.in_features != layers[0].mlp.down_proj.in_features):
                return None
        return cls(model)

    def serves(self, cache: object) -> bool:
        """Whether ``cache``'s layers are ones this call writes: growing buffers, begun."""
        layers = getattr(cache, "layers", None)
        return layers is not None and all(
            i < len(layers) and type(layers[i]) is GrowingLayer and layers[i].is_initialized for i in self.cache_index)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: object,
                 keep: torch.Tensor | None) -> None:
        """Run every layer on ``h`` ``[1, rows, hidden]`` (float32, contiguous; updated in place):
        ``cos``/``sin`` ``[1, rows, dim]``, ``keep`` ``[rows, columns + 1]`` uint8 or ``None``."""
        rows = h.shape[1]
        if h.dtype != torch.float32 or not h.is_contiguous() or h.shape[2] != self.hidden:
            raise ValueError("DecodeLayers runs on a contiguous float32 [1, rows, hidden]")
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        column = None
        layers = cache.layers
        for args, i in zip(self._args, self.cache_index, strict=True):
            keys, values, at = layers[i].room_for_one()
            if column is None:
                column = at
            if (at != column or keys.shape[0] != rows or keys.stride() != values.stride()
                    or keys.stride()[2:] != (self.head_dim, 1)):
                raise ValueError("DecodeLayers needs every layer's cache at one length, a row each")
            args.keys, args.values = keys.data_ptr(), values.data_ptr()
            args.kv_row, args.kv_head = keys.stride(0), keys.stride(1)
        if keep is not None and keep.shape != (rows, column + 1):
            raise ValueError("DecodeLayers' keep is [rows, columns] with the new one")
        self._run(len(self._args), self._args, rows, self.hidden, self.heads, self.kv_heads, self.head_dim,
                  self.intermediate, h.data_ptr(), cos.data_ptr(), sin.data_ptr(), column,
                  None if keep is None else keep.data_ptr(), self.scaling)
        for i in self.cache_index:
            layers[i].wrote_one(column)


def _grouped(linears: tuple[nn.Module, ...]) -> bool:
    """Linears one kernel call takes: all int4, all int8 (q8_0's form), all bfloat16 or all float32 (ours)."""
    return any(all(type(lin) is kind for lin in linears) for kind in OURS)


def _head_norms_fit(attention: nn.Module) -> bool:
    """No per-head norms, or Qwen3's pair: a weight of the head's size each and one eps."""
    q, k = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    if q is None and k is None:
        return True
    return (q is not None and k is not None and q.weight.shape == k.weight.shape == (attention.head_dim,)
            and getattr(q, "variance_epsilon", None) == getattr(k, "variance_epsilon", None) is not None)
