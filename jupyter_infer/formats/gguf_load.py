"""Serving a GGUF file (llama.cpp's format): ``InferApp.model = "path/to/model-q4_0.gguf"``.

transformers reads a GGUF's config and tokenizer; its weight loader dequantizes every tensor
to float, which would make a 4-bit file a float32 model. Here each linear keeps the file's
precision instead, tensor by tensor, on the meta-built model:

- 4-bit blocks (q4_0, q4_1, q4_K) become our int4 as they are: the same nibbles in groups of
  32 (``Int4Linear`` puts them in its kernel's blocks of 16 outputs, the same bytes in another
  order), each with a float16 scale (q4_0: our own form, 4.5 bits a weight), and a
  float16 min for q4_1 and q4_K (q4_K's 6-bit sub-block scales and mins times its block's,
  rounded to float16). No float copy of the weight exists on the way.
- wider blocks (q5_*, q6_K, q8_0) are dequantized one tensor at a time and quantized to int8;
  narrower ones (q2_K, q3_K, the i-quants) to int4; f32/f16/bf16 stay float.
- ``quantize = "int4"`` or ``"int8"`` puts every linear in that format instead.

Norms are float32 and the input embedding int8 beside int4/int8 linears (``int8_embedding``), as
for a safetensors checkpoint. Tensors are read with plain
file reads, not through the reader's memory map, so the file's pages are not resident after
load. Off the CPU (CUDA, MPS) every tensor is dequantized to the model's dtype.
"""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.pytorch_utils import Conv1D

from ..cpu import kernels
from ..cpu.int4_linear import Int4Linear
from ..cpu.int8_embedding import quantize_input_embedding
from ..cpu.kernel_linear import RowReader
from ..cpu.model_linears import (
    QUANTIZED,
    LinearReport,
    float_linears,
    from_rows,
    int8_available,
    quantized_by_us,
    swappable,
)
from ..cpu.process_memory import release_freed
from ..values import load_progress
from .meta_model import in_features, init_missing_buffers, linear_slots, put_tensor

# The file's block types served as int4 when ``quantize`` is "none"; the float ones stay
# float, and every other (q5_*, q6_K, q8_0: wider than 4 bits) is served as int8.
_AS_INT4 = {"Q4_0", "Q4_1", "Q4_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S",
            "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"}
_FLOAT = {"F32", "F16", "BF16", "F64"}
# Processors that only reorder a weight's rows (Llama's q/k un-permutation) or nothing: their
# work applies to rows of blocks as it does to rows of floats.
_ROW_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")
# The vocabulary's tables, which those processors leave as they are: a real vocabulary makes
# them the file's largest tensors (Qwen2.5-0.5B's 151,936 x 896: 545 MB in float32), so they are
# dequantized a chunk of rows at a time on their way into int4/int8, never whole.
_VOCABULARY = ("token_embd.weight", "output.weight")
# GGUF's names for architectures transformers calls otherwise (its loader's own renames).
_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


def is_gguf(model: str) -> bool:
    """A ``.gguf`` path, or a file that starts with GGUF's magic (Ollama's blobs have no suffix)."""
    if model.lower().endswith(".gguf"):
        return True
    path = Path(model).expanduser()
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:  # not a file (a folder, a Hub id)
        return False


def check_gguf(model: str) -> None:
    """Refuse, naming the file, a GGUF this loader cannot read (before any weight is)."""
    path = Path(model).expanduser()
    if not path.is_file():
        raise ValueError(f"{model}: no such GGUF file (a GGUF model is served from a local file path)")
    try:
        import gguf  # noqa: F401 (transformers' GGUF support needs it too)
    except ImportError as err:
        raise ValueError(f"{model}: serving a GGUF file needs the gguf package (pip install gguf)") from err
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{model}: not a GGUF file (it does not start with the GGUF magic)")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        architecture = _fields(path)["general.architecture"]
    except Exception as err:  # a truncated or corrupt file: gguf's reader says what it met
        raise ValueError(f"{model}: cannot read it as GGUF ({type(err).__name__}: {err})") from err
    known = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    if _ALIASES.get(architecture, architecture) not in known:
        raise ValueError(f"{model}: its architecture {architecture!r} is not one transformers reads from "
                         f"GGUF ({', '.join(sorted(known))}); give its Hugging Face "
                         "checkpoint folder instead")


def load_tokenizer(model: str):  # noqa: ANN201 (a transformers tokenizer)
    """The file's tokenizer as transformers builds it, with the chat template and the
    end-of-sequence token the file names (transformers' GGUF tokenizer leaves both out)."""
    path = Path(model).expanduser()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    fields = _fields(path)
    if not getattr(tokenizer, "chat_template", None) and fields.get("tokenizer.chat_template"):
        tokenizer.chat_template = fields["tokenizer.chat_template"]
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if tokenizer.eos_token_id is None and eos is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(eos))
    return tokenizer


def load_model(model: str, *, dtype: torch.dtype, device: str, quantize: str,
               prepack: bool) -> tuple[nn.Module, LinearReport]:
    """The file's model with each linear in the format chosen for it (module docstring)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    path = Path(model).expanduser()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
    file = _read_file(path)
    processor = TENSOR_PROCESSORS.get(file.fields["general.architecture"], TensorProcessor)(config=config.to_dict())
    rows_only = type(processor).__name__ in _ROW_PROCESSORS
    names = _weights_map(lm, processor)
    linears = linear_slots(lm)
    # Float linears are packed for oneDNN as they are read (packing a whole float model after
    # would hold two copies of it).
    packed, float_kernels = float_linears(dtype, prepack) if device == "cpu" else (None, "eager (aten addmm)")
    start, formats = time.perf_counter(), {}
    floats: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}  # each float tensor's block type in the file
    by_rows = device == "cpu" and rows_only  # the vocabulary's tables may be read by rows
    tables: dict[str, _Tensor] = {}  # the input embedding's, read once the linears are built
    with torch.no_grad():
        # Everything but the linears' weights first (norms, embeddings, biases: small), so a
        # linear is built once with its bias.
        for tensor in file.tensors:
            hf = names.get(tensor.name)
            if hf is not None and hf not in linears:
                kinds[hf] = tensor.kind
                if by_rows and tensor.name in _VOCABULARY:
                    tables[hf] = tensor
                else:
                    floats[hf] = torch.from_numpy(_dequantized(path, tensor, processor, names)).to(dtype)
        progress = load_progress.current()
        progress.phase("reading the GGUF linears" + (f" into {quantize}" if quantize != "none" else ""),
                       len(linears), "linears")
        for tensor in file.tensors:
            hf = names.get(tensor.name)
            if hf not in linears:
                continue
            progress.advance()
            parent, attr, child = linears[hf]
            bias = floats.pop(f"{hf.removesuffix('.weight')}.bias", None)
            fmt = _format(tensor.kind, quantize, child, device)
            if fmt == "int4" and tensor.kind in _DIRECT and rows_only:
                raw = _read(path, tensor).reshape(tensor.shape[0], -1)
                raw = processor.process(weights=raw, name=tensor.name).weights
                module = Int4Linear(*_DIRECT[tensor.kind](np.ascontiguousarray(raw)), bias)
            elif by_rows and tensor.name in _VOCABULARY and (chunked := from_rows(fmt)) is not None:
                module = chunked(_rows(path, tensor), (tensor.shape[0], tensor.shape[1]), bias)
            else:
                weight = torch.from_numpy(_dequantized(path, tensor, processor, names))
                module = _linear(weight.t() if type(child) is Conv1D else weight, bias, fmt, packed, dtype)
            setattr(parent, attr, module)
            formats[fmt] = formats.get(fmt, 0) + 1
            del module
            release_freed()  # the tensor's float copies: back to the system before the next one
        _tie_missing(lm, floats, kinds, tables, path, linears, quantize, device, packed, dtype, formats)
        if tables and quantized_by_us(lm) and _embedding_by_rows(lm, tables, path):
            tables.clear()
        for hf, tensor in tables.items():  # still float: whole
            floats[hf] = torch.from_numpy(_dequantized(path, tensor, processor, names)).to(dtype)
        for hf, value in floats.items():
            put_tensor(lm, hf, value)
        init_missing_buffers(lm)  # what it cannot compute stays on meta, named below
    lm.generation_config = _generation_config(file.fields, lm.generation_config)
    missing = [n for n, t in [*lm.named_parameters(), *lm.named_buffers()] if t.device.type == "meta"]
    if missing:
        raise ValueError(f"{model}: the file has no tensor for {', '.join(missing[:5])}"
                         f"{' …' if len(missing) > 5 else ''}")
    report = _report(formats, float_kernels, time.perf_counter() - start)
    return lm.to(device), report


def _weights_map(lm: nn.Module, processor: object) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by transformers' own mapping. It builds
    gguf's name table once per submodule (319 times, ~7 s, for a 24-layer model); the table
    depends only on the architecture and depth, so it is built once here."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    with mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        return get_gguf_hf_weights_map(lm, processor)


class _Tensor(NamedTuple):
    name: str
    kind: str  # its block type's name: "Q4_0", "F32", ...
    shape: list[int]  # in transformers' order ([out, in] for a linear)
    offset: int  # where its bytes start in the file
    size: int


class _File(NamedTuple):
    fields: dict[str, object]  # the metadata, single values unwrapped (token lists left out)
    tensors: list[_Tensor]


def _fields(path: Path) -> dict[str, object]:
    return _read_file(path).fields


def _read_file(path: Path) -> _File:
    """The file's metadata and where each tensor lies. Read once per version of the file
    (config, tokenizer and weights all ask; a file replaced in place is read again)."""
    return _read_file_at(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_file_at(path: Path, mtime_ns: int) -> _File:
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import read_field

    reader = GGUFReader(path)  # a memory map, closed with it: the weights are read plainly (_read)
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    fields = {}
    for key in reader.fields:
        if key not in skip:
            value = read_field(reader, key)
            fields[key] = value[0] if len(value) == 1 else value
    tensors = [_Tensor(t.name, t.tensor_type.name, [int(s) for s in reversed(t.shape)], t.data_offset, t.n_bytes)
               for t in reader.tensors]
    return _File(fields, tensors)


def _format(kind: str, quantize: str, child: nn.Module, device: str) -> str:
    """"int4", "int8" or "none" (float) for one linear of this block type."""
    if device != "cpu":
        return "none"
    if quantize in QUANTIZED:
        fmt = quantize
    elif kind in _FLOAT:
        fmt = "none"
    else:
        fmt = "int4" if kind in _AS_INT4 else "int8"
        # Where a kernel is missing here, the next wider format that runs (float always does).
        if fmt == "int4" and kernels.unavailable():
            fmt = "int8"
        if fmt == "int8" and not int8_available():
            fmt = "none"
    return fmt if fmt == "none" or swappable(fmt, in_features(child)) else "none"


def _read(path: Path, tensor: _Tensor, first: int = 0, size: int | None = None) -> np.ndarray:
    """A tensor's bytes (``size`` of them from byte ``first`` on), read into memory of their own."""
    size = tensor.size - first if size is None else size
    out = np.empty(size, dtype=np.uint8)
    with open(path, "rb") as f:
        f.seek(tensor.offset + first)
        if f.readinto(memoryview(out)) != size:
            raise OSError(f"{path} ends inside tensor {tensor.name!r}")
    return out


def _as_float(raw: np.ndarray, kind: str, rows: int) -> np.ndarray:
    """Bytes of ``rows`` rows of a tensor of block type ``kind`` as float32 ``[rows, ...]``."""
    from gguf import GGMLQuantizationType, dequantize

    if kind in ("F32", "F16", "F64"):
        return raw.view({"F32": np.float32, "F16": np.float16, "F64": np.float64}[kind]).astype(np.float32)
    return dequantize(raw.reshape(rows, -1), GGMLQuantizationType[kind]).astype(np.float32)


def _rows(path: Path, tensor: _Tensor) -> RowReader:
    """A vocabulary table's float32 rows ``first:stop``, read and dequantized on demand."""
    row = tensor.size // tensor.shape[0]  # whole blocks a row: a row's width is whole blocks

    def rows(first: int, stop: int) -> torch.Tensor:
        raw = _read(path, tensor, first * row, (stop - first) * row)
        return torch.from_numpy(_as_float(raw, tensor.kind, stop - first).reshape(stop - first, -1))

    return rows


def _embedding_by_rows(lm: nn.Module, tables: dict[str, _Tensor], path: Path) -> bool:
    """The input embedding in int8 beside int4/int8 linears (``int8_embedding``), read from its
    table by rows (or looked up in a tied int8 head's blocks); whether it is."""
    weight = getattr(lm.get_input_embeddings(), "weight", None)
    name = next((n for n, p in lm.named_parameters(remove_duplicate=False) if p is weight), None)
    if name not in tables:
        return False
    rows = _rows(path, tables[name])
    return quantize_input_embedding(lm, lambda _name, first, stop: rows(first, stop))


def _dequantized(path: Path, tensor: _Tensor, processor: object, names: dict[str, str]) -> np.ndarray:
    """One tensor as float32 in transformers' layout (its processor's reordering applied)."""
    shape = tensor.shape
    value = _as_float(_read(path, tensor), tensor.kind, shape[0] if len(shape) > 1 else 1)
    return np.ascontiguousarray(processor.process(weights=value.reshape(shape), name=tensor.name,
                                                  tensor_key_mapping=names, parsed_parameters={"tensors": {}}).weights)


def _q4_0(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, None]:
    """q4_0 blocks (float16 d, 16 bytes of nibbles; w = (q - 8) d): our own form, the same
    nibbles (byte j holds elements j and j + 16) and scale d, no mins."""
    blocks = raw.reshape(raw.shape[0], -1, 18)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    return _tensors(blocks[..., 2:], d, None)


def _q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q4_1 blocks (float16 d and m, 16 bytes of nibbles; w = q d + m): our layout exactly."""
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    return _tensors(blocks[..., 4:], d, m)


def _q4_k(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q4_K super-blocks of 256 (float16 d and dmin, eight 6-bit scales and mins, 128 bytes of
    nibbles; sub-block j: w = q d sc_j - dmin m_j) as eight of our groups each. Its nibbles
    run by 64: the low ones of 32 bytes are one sub-block, the high ones the next."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 144)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)  # each sub-block's 32 values
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    scales = (d * sc.astype(np.float32)).astype(np.float16)
    mins = (-dmin * m.astype(np.float32)).astype(np.float16)
    return _tensors(nibbles.reshape(rows, -1, 16), scales.reshape(rows, -1), mins.reshape(rows, -1))


def _tensors(nibbles: np.ndarray, scales: np.ndarray,
             mins: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    rows = nibbles.shape[0]

    def half(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float16).reshape(rows, -1))

    return (torch.from_numpy(np.ascontiguousarray(nibbles).reshape(rows, -1)), half(scales),
            None if mins is None else half(mins))


# The block types whose 4-bit groups are ours without a float on the way.
_DIRECT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, packed: type[nn.Module] | None,
            dtype: torch.dtype) -> nn.Module:
    """A linear of ``weight`` [out, in] in ``fmt`` (float: packed for oneDNN where it can be)."""
    if fmt in QUANTIZED:
        return QUANTIZED[fmt][0](weight, None if bias is None else bias.float())
    weight, bias = weight.to(dtype).contiguous(), None if bias is None else bias.to(dtype)
    if packed is not None:
        return packed(weight, bias)
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta", dtype=dtype)
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _tie_missing(lm: nn.Module, floats: dict[str, torch.Tensor], kinds: dict[str, str],
                 tables: dict[str, _Tensor], path: Path,
                 linears: dict[str, tuple[nn.Module, str, nn.Module]], quantize: str, device: str,
                 packed: type[nn.Module] | None, dtype: torch.dtype, formats: dict[str, int]) -> None:
    """A linear the file has no tensor for, tied to one it has (the LM head of a model with
    tied embeddings: GGUF stores ``token_embd`` once): built from that tensor (from its
    rows, a chunk at a time, where it is a vocabulary table going int4 or int8)."""
    tied = dict(getattr(lm, "all_tied_weights_keys", {}) or {})
    for hf, (parent, attr, child) in linears.items():
        if getattr(parent, attr) is not child:
            continue  # built from its own tensor
        source = tied.get(hf)
        if source in tables:
            table = tables[source]
            fmt = _format(table.kind, quantize, child, device)
            if (chunked := from_rows(fmt)) is not None:
                setattr(parent, attr, chunked(_rows(path, table), (table.shape[0], table.shape[1]), None))
                formats[fmt] = formats.get(fmt, 0) + 1
                continue
            floats[source] = _rows(path, table)(0, table.shape[0]).to(dtype)  # float: whole after all
            del tables[source]
        if source not in floats:
            continue  # left on meta: load_model names it
        fmt = _format(kinds[source], quantize, child, device)
        setattr(parent, attr, _linear(floats[source].float(), None, fmt, packed, dtype))
        formats[fmt] = formats.get(fmt, 0) + 1


def _generation_config(fields: dict[str, object], default: GenerationConfig) -> GenerationConfig:
    """End of sequence as llama.cpp reads the file: its EOS token and the end-of-turn and
    end-of-message ones where it names them (Llama 3's ``<|eot_id|>``, ``<|eom_id|>``)."""
    eos = [fields.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(int(e) for e in eos if e is not None))
    config = copy.deepcopy(default)
    if eos:
        config.eos_token_id = eos if len(eos) > 1 else eos[0]
    for key, attr in (("bos", "bos_token_id"), ("padding", "pad_token_id")):
        if (value := fields.get(f"tokenizer.ggml.{key}_token_id")) is not None:
            setattr(config, attr, int(value))
    return config


def _report(formats: dict[str, int], float_kernels: str, seconds: float) -> LinearReport:
    kernels = "; ".join(f"{QUANTIZED[f][1] if f in QUANTIZED else float_kernels} x{n}" for f, n in sorted(formats.items()))
    return LinearReport(kernels=f"from GGUF: {kernels}", layers=sum(formats.values()), seconds=seconds)
