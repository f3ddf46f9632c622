"""A lean forward for the Llama family's decoder (Llama, Mistral, Qwen2, Qwen3), for ragged steps.

At one row a decode step is a read of the weights and little else, yet transformers' module
tree spent ~8 ms of an 18 ms 0.5 B int4 step around its kernels on a 2-core CPU: module
calls, keyword plumbing, RMSNorm as six small ops, q, k and v as three calls. This forward runs
the same model — its own weights, norms, rotary embedding and ``ragged.block_attention`` — with
none of that:

- each norm is one ``F.rms_norm`` (float32; another dtype calls the model's own norm);
- with our linears (int4, int8, float32), q, k and v are one kernel call, gate and up another
  (``joint_linears.JointLinears``), and the attention output and MLP projections add into the
  residual stream where they land;
- RoPE rotates q and k in one pass over their joint columns (with our linears or int8, in
  place, in one C call that gives torch's numbers to the bit);
- with our linears or fbgemm's int8, in float32, the norms, SwiGLU and a decode step's
  attention are one C call each (``layer_ops``; our kernel calls normalize their rows and take
  SwiGLU on their way in): torch's arithmetic but for the order of sums and exp's last bits;
- with linears that round activations or weights already (int4, int8, bfloat16), a long
  prompt's attention is ``layer_ops.attend_prompt``'s: bfloat16 products where the CPU has the
  bfloat16 dot, 2-3x torch's CPU flash attention, which was 45 % of an 8k-token prompt at 1.5B
  (docs/engine.md); float32 products with AVX2 elsewhere, 1.3-1.6x it (docs/benchmark.md, issue 58).

``LlamaForward.of`` takes a model only where its classes are these and a probe at load gives
the logits transformers' own forward gives; any other model keeps transformers' forward
(docs/engine.md, "The Llama family's own forward").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from ...cpu import kernels, layer_ops
from ...cpu.float_linear import BF16Linear
from ...cpu.int4_linear import Int4Linear
from ...cpu.joint_linears import JointLinears
from ...cpu.model_linears import OURS, Int8Linear, Q8Linear
from ..kv.kv_cache import new_cache
from .decode_layers import DecodeLayers
from .ragged import Block, Step, block_attention, forward

# Architectures whose decoder layer is exactly: norm, q/k/v (Qwen3: per-head q/k norms), RoPE,
# attention, o, residual, norm, down(silu(gate) * up), residual.
ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
# Linears whose rounding (of the activations to int8, or of everything to bfloat16) is already
# coarser than a bfloat16 attention's: beside them a long prompt attends in C (in bfloat16
# where the CPU has its dot). A float32 model keeps SDPA's attention.
ROUNDING = (Int4Linear, Q8Linear, BF16Linear, Int8Linear)
PROMPT_IN_C_TOKENS = 256  # a prompt this long or longer attends in C (shorter: attention is a small share)


def _norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm: one fused op in float32 (the same arithmetic as transformers'
    float32 path); in another dtype the model's own module, whose casts we keep exactly."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
    return module(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor, ``[1, tokens, heads, dim]`` (q and k
    side by side, or one of them), with its own ``rotate_half``."""
    return x * cos + rotate_half(x) * sin


@dataclass
class _Layer:
    attention: nn.Module  # its layer_idx and scaling are what block_attention reads
    q_norm: nn.Module | None  # Qwen3's per-head norms
    k_norm: nn.Module | None
    heads: int
    kv_heads: int
    head_dim: int
    norm_qkv: Callable[[torch.Tensor], torch.Tensor]  # of h: [1, T, (heads + 2 kv heads) * dim]
    o_into: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # h += o(x)
    norm_gate_up: Callable[[torch.Tensor], torch.Tensor]  # of h: [1, T, 2 * intermediate]
    down_into: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # h += down(silu(gate) * up), of gate | up


def _joint(linears: list[nn.Module], fp32: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """Several linears over one input, outputs side by side: one kernel call where all are ours
    of one kind (int4, int8, float32 or bfloat16 blocks) in a float32 model (``fp32``: the
    kernel call reads and writes float32)."""
    if fp32 and any(all(isinstance(lin, kind) for lin in linears) for kind in OURS):
        return JointLinears(linears)
    if len(linears) == 1:
        return linears[0]
    return lambda x: torch.cat([lin(x) for lin in linears], dim=-1)


def _normed(norm: nn.Module, joint: Callable[[torch.Tensor], torch.Tensor],
            c_ops: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """``joint(norm(h))``. With ``c_ops`` the norm is ``layer_ops``' (one call, not six torch
    ops; its sum of squares in its own order, so the last bit can differ from transformers', as
    int8 and int4's own rounding of the activations already does), and with int4 linears it is
    done by their kernel call, each row on its way in."""
    if not c_ops:
        return lambda h: joint(_norm(norm, h))
    args = (norm.weight.detach().contiguous(), float(norm.variance_epsilon))
    if isinstance(joint, JointLinears):
        return lambda h: joint(h, norm=args)
    return lambda h: joint(layer_ops.rms_norm(h, *args))


def _adding(linear: nn.Module, fp32: bool, gated: bool = False,
            c_ops: bool = False) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``h += linear(x)``, written into ``h`` by the int4 kernel itself. ``gated``: ``x`` is
    ``[gate | up]`` and ``linear`` reads ``silu(gate) * up`` (with ``c_ops``, ``layer_ops``' or,
    for an int4 linear, its kernel call's on the way in: the last bits of their exp are their own)."""
    if fp32 and isinstance(linear, OURS):
        into = JointLinears([linear])
        if gated and not c_ops:
            return lambda x, h: into(_swiglu(x), into=h)
        return lambda x, h: into(x, into=h, gated=gated)
    if gated:
        swiglu = layer_ops.swiglu if c_ops else _swiglu
        return lambda x, h: h.add_(linear(swiglu(x)))
    return lambda x, h: h.add_(linear(x))


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _layer(layer: nn.Module, c_ops: bool, fp32: bool) -> _Layer:
    a, mlp = layer.self_attn, layer.mlp
    config = a.config
    return _Layer(
        attention=a, q_norm=getattr(a, "q_norm", None), k_norm=getattr(a, "k_norm", None),
        heads=config.num_attention_heads, kv_heads=config.num_key_value_heads, head_dim=a.head_dim,
        norm_qkv=_normed(layer.input_layernorm, _joint([a.q_proj, a.k_proj, a.v_proj], fp32), c_ops),
        o_into=_adding(a.o_proj, fp32),
        norm_gate_up=_normed(layer.post_attention_layernorm, _joint([mlp.gate_proj, mlp.up_proj], fp32), c_ops),
        down_into=_adding(mlp.down_proj, fp32, gated=True, c_ops=c_ops))


class LlamaForward:
    """``model``'s forward over a ragged step (``ragged.forward``'s call), without transformers'
    module tree around the kernels. ``fused`` (a float32 model with our linears or int8, where
    the int4 library builds): the norms, SwiGLU and a decode step's attention are ``layer_ops``'
    C (the int4 kernel calls normalize their rows and take SwiGLU on their way in); the last bits
    can differ from torch's, as the quantized activations' own rounding (with int8 or int4)
    already makes them."""

    def __init__(self, model: nn.Module, fused: bool = True) -> None:
        inner = model.model
        ours = any(isinstance(m, (*OURS, Int8Linear)) for m in model.modules())
        # RoPE in C, in place, is torch's to the bit (float32): wherever the int4 library builds.
        self.rope_in_place = (ours and inner.norm.weight.dtype == torch.float32
                              and kernels.unavailable() is None)
        self.attend_in_c = c_ops = fused and self.rope_in_place
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        fp32 = inner.norm.weight.dtype == torch.float32
        self.norm_head = _normed(inner.norm, _joint([model.lm_head], fp32), c_ops)  # logits of the last norm
        self.layers = [_layer(layer, c_ops, fp32) for layer in inner.layers]
        # With our int4, int8 or float32 linears, a decode step's layers are one C call (decode_layers.py).
        self.one_call = DecodeLayers.of(model) if c_ops else None
        self.prompt_in_c = (c_ops and any(isinstance(m, ROUNDING) for m in model.modules())
                            and _prompt_attention_in_c(self.layers[0].head_dim))

    @classmethod
    def of(cls, model: nn.Module) -> LlamaForward | None:
        """This forward for ``model`` (installed for ragged steps) where its architecture is one
        of ours and a short probe gives the logits transformers' forward gives; else ``None``."""
        config = model.config
        if (type(model).__name__ not in ARCHITECTURES or getattr(config, "hidden_act", None) != "silu"
                or not all(_plain(layer) for layer in model.model.layers)):
            return None
        # The probe checks the decoder's structure, with the norms and SwiGLU as torch computes
        # them: with int4 the kernel's own (its sum's order, its exp) can flip an activation's
        # int8 rounding, and random weights carry that to a few % of the logits
        # (tests/cpu/test_layer_ops.py checks each C op against torch's).
        try:
            with torch.inference_mode():
                theirs, ours = _probe(model, None), _probe(model, cls(model, fused=False))
        except Exception:  # noqa: BLE001 - a model this forward cannot run keeps transformers'
            return None
        close = torch.allclose(ours.float(), theirs.float(), rtol=1e-3, atol=1e-3 * float(theirs.abs().max()) + 1e-4)
        return cls(model) if close else None

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, step: Step,
                 keep: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[1, kept tokens, vocab]`` (``keep``: the packed columns to score; ``None``: all)."""
        h = self.embed(input_ids)
        cos_t, sin_t = self.rotary(h, position_ids)  # [1, T, dim]
        decode = self._decode(step)
        if decode is not None and self.one_call is not None and self.one_call.serves(decode[0]):
            self.one_call(h, cos_t, sin_t, *decode)
        else:
            h = self._layers(h, cos_t, sin_t, step, decode, self._prompt(step))
        return self.norm_head(h if keep is None else h[:, keep])  # a row's norm is its own: select first

    def _layers(self, h: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, step: Step,
                decode: tuple[object, torch.Tensor | None] | None, prompt: object | None) -> torch.Tensor:
        """The decoder layers over ``h`` ``[1, T, hidden]``, one call after another (``prompt``:
        the cache of a step that is one long prompt alone, attended in C)."""
        cos, sin = cos_t.unsqueeze(2), sin_t.unsqueeze(2)  # [1, T, 1, dim]
        tokens = h.shape[1]
        for layer in self.layers:
            heads, kv, dim = layer.heads, layer.kv_heads, layer.head_dim
            qkv = layer.norm_qkv(h).view(1, tokens, heads + 2 * kv, dim)
            q, k, v = qkv[:, :, :heads], qkv[:, :, heads : heads + kv], qkv[:, :, heads + kv :]
            if layer.q_norm is not None and self.attend_in_c:  # Qwen3's per-head norms, in C too
                layer_ops.head_norm_(qkv, 0, heads, layer.q_norm.weight, layer.q_norm.variance_epsilon)
                layer_ops.head_norm_(qkv, heads, kv, layer.k_norm.weight, layer.k_norm.variance_epsilon)
                layer_ops.rope_(qkv, heads + kv, cos_t, sin_t)
            elif layer.q_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            elif self.rope_in_place:  # qkv is a fresh, contiguous tensor
                layer_ops.rope_(qkv, heads + kv, cos_t, sin_t)
            else:  # q and k side by side: one rotation
                qk = _rotate(qkv[:, :, : heads + kv], cos, sin)
                q, k = qk[:, :, :heads], qk[:, :, heads:]
            if decode is not None:  # one new token a row: [rows, heads, dim] against the row's cache
                cache, seen = decode
                keys, values = cache.layers[layer.attention.layer_idx].update(k[0].unsqueeze(2), v[0].unsqueeze(2))
                out = layer_ops.attend(q[0], keys, values, seen, layer.attention.scaling)
            elif prompt is not None:  # its queries are its cache's last columns: causal, no mask
                keys, values = prompt.layers[layer.attention.layer_idx].update(k.transpose(1, 2), v.transpose(1, 2))
                out = layer_ops.attend_prompt(q[0], keys[0], values[0], layer.attention.scaling)
            else:
                out, _ = block_attention(layer.attention, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         None, scaling=layer.attention.scaling, jupyter_infer_step=step)
            h = layer.o_into(out.reshape(1, tokens, heads * dim), h)
            h = layer.down_into(layer.norm_gate_up(h), h)
        return h

    def _decode(self, step: Step) -> tuple[object, torch.Tensor | None] | None:
        """For a step of one block of one new token a row (decode, no shared prefix) where
        attention runs in C: the block's cache and which columns each row sees (``None``: all)."""
        if not self.attend_in_c or len(step.blocks) != 1:
            return None
        block = step.blocks[0]
        if block.ids.shape[1] != 1 or block.shared is not None:
            return None
        return block.cache, None if bool(block.mask.all()) else block.mask.to(torch.uint8).contiguous()

    def _prompt(self, step: Step) -> object | None:
        """For a step that is one row's prompt alone (a fresh one, or a chunk after its cache:
        every column real, no shared prefix), ``PROMPT_IN_C_TOKENS`` or longer, where prompts
        attend in C: the row's cache."""
        if not self.prompt_in_c or len(step.blocks) != 1:
            return None
        block = step.blocks[0]
        rows, width = block.ids.shape
        if rows != 1 or width < PROMPT_IN_C_TOKENS or block.shared is not None or not bool(block.mask.all()):
            return None
        return block.cache


def _prompt_attention_in_c(head_dim: int) -> bool:
    """Whether ``layer_ops.attend_prompt`` runs here for heads of ``head_dim`` (a multiple of 16)."""
    one = torch.ones((1, 1, head_dim))
    return layer_ops.attend_prompt(one, one, one, 1.0) is not None


def _plain(layer: nn.Module) -> bool:
    """Whether a decoder layer holds exactly what ``LlamaForward`` runs (no extra modules or
    multipliers a variant might add)."""
    a, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if a is None or mlp is None:
        return False
    names = {name for name, _ in a.named_children()}
    return (names <= {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}
            and {name for name, _ in mlp.named_children()} <= {"gate_proj", "up_proj", "down_proj", "act_fn"}
            and {name for name, _ in layer.named_children()} == {"self_attn", "mlp", "input_layernorm",
                                                                 "post_attention_layernorm"})


def _probe(model: nn.Module, lean: LlamaForward | None) -> torch.Tensor:
    """Two rows' logits, one of them left-padded: their prompts' every column, then a decode step."""
    device = next(model.parameters()).device
    cache = new_cache(model.config)

    def block(ids: list[list[int]], mask: list[list[int]], positions: list[list[int]]) -> Block:
        return Block(cache, *(torch.tensor(t, device=device) for t in (ids, mask, positions)))

    prompts = forward(model, [block([[0, 5, 7], [3, 4, 9]], [[0, 1, 1], [1, 1, 1]], [[0, 0, 1], [0, 1, 2]])],
                      every=True, lean=lean)
    step = forward(model, [block([[11], [12]], [[0, 1, 1, 1], [1, 1, 1, 1]], [[2], [3]])], lean=lean)
    return torch.cat([prompts, step])
