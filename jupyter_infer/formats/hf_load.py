"""Loading a Hugging Face causal LM, and how much memory and time it took.

Our CPU linears (``quantize``: int8, int4; float32 and bfloat16 in our blocks) load
**streamed** where they can: the model is built on the meta device, each linear's weight is
read from the safetensors files (memory-mapped) one tensor at a time and quantized or packed at
once, and only what stays float (embeddings, norms) is materialized. So the checkpoint is never
in memory beside the served model: loading peaks near the served model's size instead of near
float32's plus it (six times int4's; for float32 itself, the file's pages and the packed copy
were ~2.4x resident). Other linears (oneDNN's, eager) load through transformers'
``from_pretrained``. A checkpoint the stream cannot
read as it is (other key names, weights of another format, no safetensors) loads whole and is
quantized after, and ``LoadReport.streamed`` says so.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.pytorch_utils import Conv1D

from ..cpu.float_embedding import BF16Embedding, TiedFloatEmbedding, compact_float_embedding
from ..cpu.float_linear import BF16Linear
from ..cpu.int8_embedding import Q8Embedding, quantize_input_embedding
from ..cpu.model_linears import (
    OURS,
    QUANTIZED,
    Int8Linear,
    LinearReport,
    PackedLinear,
    float_linears,
    from_rows,
    quantized_by_us,
    swap_linears,
    swappable,
)
from ..cpu.process_memory import current_rss, peak_rss, release_freed
from ..values import load_progress
from . import gguf_load, gptq_awq
from .meta_model import in_features, init_missing_buffers, linear_slots, put_tensor
from .weight_cache import WeightCache, key_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    seconds: float  # from the first byte read to a model ready to serve
    streamed: bool  # quantized tensor by tensor (no float copy of the model), or loaded whole
    weight_bytes: int  # what the served model's parameters and buffers hold
    peak_rss_bytes: int  # the process's peak resident memory once loaded (loading included)
    rss_bytes: int  # its resident memory right after

    def details(self) -> dict[str, object]:
        return {"load_s": round(self.seconds, 2), "load_streamed": self.streamed,
                "weight_bytes": self.weight_bytes, "load_peak_rss_bytes": self.peak_rss_bytes,
                "rss_after_load_bytes": self.rss_bytes}


def load_causal_lm(model: str, *, dtype: torch.dtype, device: str, local_files_only: bool,
                   quantize: str, prepack: bool) -> tuple[nn.Module, LinearReport, LoadReport]:
    """The model on ``device`` with its CPU linears swapped (``linears.swap_linears``)."""
    start = time.perf_counter()
    streamed = None
    if gguf_load.is_gguf(model):
        streamed = gguf_load.load_model(model, dtype=dtype, device=device, quantize=quantize, prepack=prepack)
    elif device == "cpu" and (ours := _our_linears(quantize, dtype, prepack)) is not None:
        folder = _safetensors_folder(model, local_files_only)
        streamed = _load_streamed(folder, held_as(dtype, ours[0]), quantize, *ours) if folder else None
    if streamed is None:
        load_progress.current().phase("loading the weights (transformers)")
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, local_files_only=local_files_only).to(device)
        linears = LinearReport(kernels="eager (aten addmm)", layers=0, seconds=0.0)
        if device == "cpu":
            linears = swap_linears(lm, prepack=prepack, quantize=quantize)
            if linears.layers:
                _leave_the_file(lm)
    else:
        lm, linears = streamed
    # Loaded whole, or from a GGUF (the streamed load did this as it read).
    if quantized_by_us(lm):
        quantize_input_embedding(lm)
    elif device == "cpu":
        compact_float_embedding(lm)
    lm.eval()
    release_freed()
    report = LoadReport(seconds=time.perf_counter() - start, streamed=streamed is not None,
                        weight_bytes=resident_bytes(lm), peak_rss_bytes=peak_rss(), rss_bytes=current_rss())
    return lm, linears, report


def _leave_the_file(lm: nn.Module) -> None:
    """Copy what stayed float (embeddings, norms) out of the checkpoint's memory map.
    ``from_pretrained`` leaves tensors as views of the mapped safetensors file; once the linears
    were packed or quantized from it, every page of it was read, and the map holds them all
    as resident memory for as long as any view lives (the 0.5b shape's float32 server: 3.26 GB
    resident before, 1.83 GB after)."""
    with torch.no_grad():
        for param in lm.parameters():  # tied parameters are one object: copied once
            param.data = param.data.clone()
        for module in lm.modules():
            if isinstance(module, OURS):  # copies of their own already, whose addresses our kernels hold
                continue
            for name, buf in list(module._buffers.items()):
                if buf is not None and not buf.is_mkldnn:
                    module._buffers[name] = buf.clone()


def check_format(model: str) -> None:
    """Refuse, by name, a model file this loader does not read, before transformers answers
    "the config file ... is not a valid JSON file" for it."""
    if gguf_load.is_gguf(model):
        gguf_load.check_gguf(model)
    elif Path(model).expanduser().is_file():
        raise ValueError(f"{model}: a model is a Hugging Face checkpoint folder (config.json, safetensors), "
                         "its Hub name, or a GGUF file (.gguf); this file is none of those")


def resident_bytes(model: nn.Module) -> int:
    """Bytes in the model's parameters and buffers, each storage counted once, and in
    fbgemm's packed int8 weights where those serve (opaque to torch: one byte a weight and a
    scale a row)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t is None or t.device.type == "meta":
            continue
        if t.is_mkldnn:  # oneDNN's prepacked weights: opaque, no storage to share
            seen[id(t)] = t.numel() * t.element_size()
        else:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    packed = sum(m.in_features * m.out_features + 8 * m.out_features
                 for m in model.modules() if isinstance(m, Int8Linear))
    return sum(seen.values()) + packed


def parameter_count(model: nn.Module) -> int:
    """The model's parameters as its checkpoint counts them. A swapped linear's weight and
    bias are buffers or an opaque pack, not parameters, and so is a quantized embedding's table:
    counted here, once; a tied output head's own packed copy of the embedding is not counted
    again."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings() if getattr(config, "tie_word_embeddings", False) else None
    swapped = sum(m.out_features * (m.in_features + _has_bias(m)) for m in model.modules()
                  if isinstance(m, (PackedLinear, Int8Linear, *OURS)) and m is not head)
    tables = sum(m.num_embeddings * m.embedding_dim for m in model.modules()
                 if isinstance(m, (Q8Embedding, BF16Embedding, TiedFloatEmbedding)))
    return sum(p.numel() for p in model.parameters()) + swapped + tables


def _has_bias(linear: nn.Module) -> bool:
    return getattr(linear, "has_bias", None) or getattr(linear, "bias", None) is not None


def _safetensors_folder(model: str, local_files_only: bool) -> Path | None:
    """A local folder with the checkpoint's config and safetensors files, or None."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors"],
                                            local_files_only=local_files_only))
        except Exception as err:  # the whole load says what is wrong, in transformers' words
            log.debug("no safetensors snapshot of %s (%s): loading it whole", model, err)
            return None
    has_weights = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    return folder if has_weights and (folder / "config.json").is_file() else None


def checkpoint_files(model: str) -> list[Path]:
    """The local files a model's weights and config come from (what is computed from them is
    keyed by these: their paths, sizes and times); [] when none is found."""
    if gguf_load.is_gguf(model):
        return [Path(model).expanduser()]
    folder = _safetensors_folder(model, local_files_only=True) or Path(model).expanduser()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in {".safetensors", ".bin", ".json"} and p.is_file())


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Each tensor's name and the safetensors file that holds it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {k: folder / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    path = folder / "model.safetensors"
    return {k: path for k in _header(path)[0] if k != "__metadata__"}


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


@functools.lru_cache(maxsize=64)
def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (tensor name -> dtype, shape, offsets) and where data starts."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def read_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, read into memory of its own. Plain reads, not a
    memory map: a mapped file's pages count as the process's resident memory for as long as
    the map lives, so streaming through one would hold the whole float checkpoint."""
    header, start = _header(path)
    entry = header[name]
    begin, end = entry["data_offsets"]
    out = torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
    _read_into(path, name, start + begin, end - begin, out)
    return out


def read_rows(path: Path, name: str, first: int, stop: int) -> torch.Tensor:
    """Rows ``first:stop`` of a tensor of a safetensors file (plain reads, as ``read_tensor``)."""
    header, start = _header(path)
    entry = header[name]
    out = torch.empty([stop - first, *entry["shape"][1:]], dtype=_DTYPES[entry["dtype"]])
    row = out[0].numel() * out.element_size() if out.numel() else 0
    _read_into(path, name, start + entry["data_offsets"][0] + first * row, (stop - first) * row, out)
    return out


def _read_into(path: Path, name: str, offset: int, size: int, out: torch.Tensor) -> None:
    view = memoryview(out.view(torch.uint8).reshape(-1).numpy()) if out.numel() else memoryview(b"")
    with open(path, "rb") as f:
        f.seek(offset)
        if f.readinto(view) != size:
            raise OSError(f"{path} ends inside tensor {name!r}")


def _our_linears(quantize: str, dtype: torch.dtype, prepack: bool) -> tuple[Callable[..., nn.Module], str] | None:
    """What builds the CPU linears, where each can be built as its weight is read: our int8 and
    int4, our float32 and bfloat16 blocks (and fbgemm's int8). None: the model's own linears
    stay, or oneDNN's, which is given the loaded model."""
    if quantize in QUANTIZED:
        return QUANTIZED[quantize]
    make, kernels = float_linears(dtype, prepack)
    return (make, kernels) if make in OURS else None


def held_as(dtype: torch.dtype, make: Callable[..., nn.Module]) -> torch.dtype:
    """The dtype a model of ``dtype`` whose linears ``make`` builds is held in: float32 where they
    are our bfloat16 blocks. Their kernel reads and writes float32 (on AVX512-BF16 the activations
    meet the weights rounded to bfloat16, as a bfloat16 model's are), and a float32 model's
    decode step runs in C (``layer_ops``, ``decode_layers``) where a bfloat16 one's runs torch's
    ops a layer at a time: the same half-size weight read, one stream 46 -> 52.5 tok/s on the
    0.5b shape (docs/engine.md). Norms are then float32, and so is the KV cache (twice
    bfloat16's bytes); an untied embedding stays bfloat16 (``float_embedding``)."""
    return torch.float32 if make is BF16Linear else dtype


def held_dtype(model: nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype ``model`` is held in (its activations', its KV cache's): ``held_as``'s choice."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), default)


def _load_streamed(folder: Path, dtype: torch.dtype, quantize: str, make: Callable[..., nn.Module],
                   kernels: str) -> tuple[nn.Module, LinearReport] | None:
    """Build on meta, make each linear (quantized, or packed) as its weight is read; None where
    the checkpoint does not read that way (the caller loads it whole)."""
    config = AutoConfig.from_pretrained(folder)
    prequantized = gptq_awq.take(config, folder)  # GPTQ/AWQ: read into our kernels (gptq_awq.py)
    if getattr(config, "quantization_config", None):
        return None  # its own format: transformers' quantizer reads it
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
    files = _tensor_files(folder)
    packed = gptq_awq.quantized_names(files) if prequantized else set()
    tied = dict(getattr(lm, "all_tied_weights_keys", {}) or {})
    wanted = [n for n, _ in lm.named_parameters(remove_duplicate=False)]
    wanted += [n for n, _ in lm.named_buffers() if n not in dict(lm.named_non_persistent_buffers())]
    if any(n not in files and tied.get(n) not in files and n not in packed for n in wanted):
        return None  # renamed keys (transformers' conversion mappings) or missing weights

    def source(name: str) -> str:
        return name if name in files else tied[name]

    def read(name: str) -> torch.Tensor:
        return read_tensor(files[source(name)], source(name))

    def rows(name: str, first: int, stop: int) -> torch.Tensor:
        return read_rows(files[source(name)], source(name), first, stop)

    chunked = from_rows(quantize)
    start, swapped = time.perf_counter(), 0
    slots = linear_slots(lm)
    # What we quantize is kept on disk: a second start reads it instead (weight_cache.py).
    cache = _weight_cache(folder, files, quantize, kernels, dtype) if chunked is not None and not packed else None
    progress = load_progress.current()
    progress.phase("reading the linears" + (" from the weight cache" if cache and cache.hit else
                                            f" into {quantize}" if quantize != "none" else ""), len(slots), "linears")
    with torch.no_grad():
        for weight_name, (parent, attr, child) in slots.items():
            progress.advance()
            if weight_name not in packed and not swappable(quantize, in_features(child)):
                continue  # left on meta: read with the float tensors below
            module = cache.get(weight_name, _shape(child)) if cache else None
            if module is None and weight_name in packed:
                module = prequantized.linear(read, files, weight_name.removesuffix(".weight"), _bias(read, weight_name, child))
            elif module is None:
                module = _linear_of(weight_name, child, read, rows, make, chunked)
                if cache is not None:
                    cache.put(weight_name, module)
            setattr(parent, attr, module)
            swapped += 1
            del module
            release_freed()  # the float copies (or the cache file's): back to the system before the next one
        if cache is not None:
            cache.finish()
        # Read a chunk of rows at a time: a real vocabulary's float table is the checkpoint's
        # largest tensor, and whole it would set the load's peak.
        if quantized_by_us(lm):
            quantize_input_embedding(lm, rows)
        else:
            compact_float_embedding(lm, lambda name, first, stop: rows(name, first, stop).float())
        seconds = time.perf_counter() - start
        progress.phase("reading the other tensors (embeddings, norms)")
        if not _read_the_rest(lm, read, files, dtype):
            return None
    try:
        lm.generation_config = GenerationConfig.from_pretrained(folder)
    except OSError:
        pass  # no generation_config.json: from_config's default stands
    if any(t.device.type == "meta" for t in [*lm.parameters(), *lm.buffers()]):
        return None
    if packed:
        kernels = f"{prequantized.kernels(len(packed))}; {kernels}"
    return lm, LinearReport(kernels=kernels, layers=swapped, seconds=seconds,
                            cache=cache.status() if cache is not None else None)


def _weight_cache(folder: Path, files: dict[str, Path], quantize: str, kernels: str,
                  dtype: torch.dtype) -> WeightCache:
    """Our quantized linears kept on disk (weight_cache.py): only our kernels' formats (fbgemm's
    int8, where ours cannot build, is not ours to store), keyed by the kernels too."""
    return WeightCache(key_of([*files.values(), folder / "config.json"], f"{quantize} {kernels}", dtype), str(folder))


def _read_the_rest(lm: nn.Module, read: Callable[[str], torch.Tensor], files: dict[str, Path],
                   dtype: torch.dtype) -> bool:
    """The tensors still on meta (norms, the float embeddings), read; False where a buffer
    stays on meta (``init_missing_buffers``)."""
    for name, param in list(lm.named_parameters(remove_duplicate=False)):
        if param.device.type == "meta":
            put_tensor(lm, name, read(name).to(dtype))
    for name, buf in list(lm.named_buffers()):
        if buf.device.type == "meta" and name in files:
            put_tensor(lm, name, read(name).to(buf.dtype))
    return init_missing_buffers(lm)


def _bias(read: Callable[[str], torch.Tensor], weight_name: str, child: nn.Module) -> torch.Tensor | None:
    return read(f"{weight_name.removesuffix('.weight')}.bias").float() if child.bias is not None else None


def _linear_of(weight_name: str, child: nn.Module, read: Callable[[str], torch.Tensor],
               rows: Callable[[str, int, int], torch.Tensor], make: Callable[..., nn.Module],
               chunked: Callable[..., nn.Module] | None) -> nn.Module:
    """Our linear for the checkpoint's ``weight_name`` (``child`` the model's, on meta)."""
    bias = _bias(read, weight_name, child)
    if chunked is not None and type(child) is not Conv1D:
        # Quantized a chunk of rows at a time: a real vocabulary's (tied) output head is the
        # checkpoint's largest tensor, and whole in float32 it would set the peak.
        return chunked(lambda first, stop: rows(weight_name, first, stop).float(),
                       (child.out_features, child.in_features), bias)
    weight = read(weight_name).float()
    return make(weight.t() if type(child) is Conv1D else weight, bias)


def _shape(linear: nn.Module) -> tuple[int, int]:
    """A linear's weight as [out, in] (GPT-2's Conv1D keeps it [in, out])."""
    return (linear.nf, linear.nx) if type(linear) is Conv1D else (linear.out_features, linear.in_features)

