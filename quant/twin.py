"""A model's twin: the same architecture, metadata and tensors (names, shapes, per-tensor types) with
valid random data, written in seconds. Kernel speed does not depend on the weights' values, so a
twin decodes and prefills as fast as the model it copies: timing it says how fast a model runs here
before its weights are downloaded. A large model's twin keeps fewer blocks (`reduce_layers`), with
the blocks' type mix matched to the whole model's (`matching_blocks`); a header comes from a GGUF
(`read_header`), from a Hugging Face config.json (ondevice.quant.hfconfig), and in any file type
llama.cpp's quantizer would give it (`quantized_header`, from its dry run).

    header = read_header("model.gguf")                       # or header_from_hf_config(...)
    small = reduce_layers(header, 3, matching_blocks(header, 3))
    write_twin(small, "twin.gguf")

Every tensor is written, the token embedding too, although a token reads only its own row of it: left
zeros, every activation is zero, every attention score equal, and attention runs faster than on real
activations (docs/twins.md), while a MoE router would send every token to the same experts. For the same
reason a gain (a norm's weight, RoPE's frequency factors: `is_gain`) is written around one, as a trained
model's are, not as small as a weight: tiny gains make tiny activations, and some kernels run faster on those.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFValueType, Keys
from ondevice.quant.formats import block_format
from ondevice.quant.header import (
    SPLIT_KEY_PREFIX,
    Field,
    Header,
    TensorSpec,
    data_layout,
    encode_header,
    read_header,
)
from ondevice.quant.quantize import file_type
from ondevice.quant.twindata import CHUNK_BYTES, block_pool, gain_pool, write_tiled

from ondevice.core import paths
from ondevice.core.errors import QuantError, SpecError

__all__ = [
    "Field",
    "Header",
    "TensorSpec",
    "read_header",
    "shape_key",
    "layer_signatures",
    "reduce_layers",
    "matching_blocks",
    "leading_blocks",
    "quantized_header",
    "write_twin",
    "ModelData",
    "is_gain",
    "split_outside_blocks",
    "header_spec",
]

# tensors that scale activations (norm gains, RoPE frequency factors: "blk.0.attn_q_norm.weight",
# "rope_freqs.weight"), written with values around one (twindata.gain_pool)
_GAIN = re.compile(r"(^|\.)(\w*norm\w*|rope_freqs|rope_factors_\w+)\.weight$")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")  # gguf's per-block tensor names: "blk.{bid}.attn_q.weight"
# general.* keys that decide speed; every other general.* key is a label (name, licence, tags, file type)
_GENERAL_KEPT = (Keys.General.ARCHITECTURE, Keys.General.ALIGNMENT, Keys.General.QUANTIZATION_VERSION)
# arrays that are not per layer even when their length happens to equal the layer count
_NOT_PER_LAYER = (Keys.Rope.DIMENSION_SECTIONS, Keys.Classifier.OUTPUT_LABELS)
# llama.cpp's deepseek2 loader reads no q_lora_rank at 26 or 27 blocks (its test for DeepSeek-V2-Lite, whose q is
# projected directly: the converter writes no key) and needs one at any other depth: a header without it, cut, says 0
_Q_DIRECT = {"deepseek2": Keys.Attention.Q_LORA_RANK}


def shape_key(header: Header) -> str:
    """A stable hash (16 hex digits) of what decides a model's speed: the architecture, every
    hyperparameter, the vocabulary's size, and each tensor's name, shape and type. Labels (general.name,
    descriptions, licence), the tokenizer's strings, scores and special ids, and the file's name are
    left out; a float32 value counts as float32 (as a file holds it), an int whatever its width."""
    fields = {key: _canonical(f) for key, f in header.fields.items() if _decides_speed(key)}
    tokens = header.fields.get(Keys.Tokenizer.LIST)
    payload = {
        "fields": fields,
        "n_vocab": len(tokens.value) if tokens is not None and tokens.type == GGUFValueType.ARRAY else None,
        "tensors": sorted([t.name, list(t.shape), t.type] for t in header.tensors),
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _decides_speed(key: str) -> bool:
    if key.startswith("general."):
        return key in _GENERAL_KEPT
    return not key.startswith(("tokenizer.", "quantize.", SPLIT_KEY_PREFIX))  # provenance and tokenization


def _canonical(field: Field):
    if field.type != GGUFValueType.ARRAY:
        return float(np.float32(field.value)) if field.type == GGUFValueType.FLOAT32 else field.value
    if field.item_type == GGUFValueType.ARRAY:
        return [_canonical(inner) for inner in field.value]
    if field.item_type == GGUFValueType.FLOAT32:
        return [float(v) for v in np.asarray(field.value, dtype=np.float32)]
    return list(field.value)


def is_gain(tensor_name: str) -> bool:
    """Whether a tensor scales activations (a norm's gain, RoPE's frequency factors) rather than mixing them."""
    return _GAIN.search(tensor_name) is not None


def _block_of(name: str) -> tuple[int, str] | None:
    match = _BLOCK.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def layer_signatures(header: Header) -> list[tuple[tuple[str, tuple[int, ...], str], ...]]:
    """Per block, its tensors' (name within the block, shape, type), sorted: blocks of a quant mix
    such as Q4_K_M differ (attn_v and ffn_down get more bits in some layers)."""
    n_layer = header.n_layer
    per_block: list[list[tuple[str, tuple[int, ...], str]]] = [[] for _ in range(n_layer)]
    for t in header.tensors:
        where = _block_of(t.name)
        if where is not None and where[0] < n_layer:
            per_block[where[0]].append((where[1], t.shape, t.type))
    return [tuple(sorted(block)) for block in per_block]


def matching_blocks(header: Header, k: int) -> list[int]:
    """k block indices whose signatures (layer_signatures) come in the whole model's proportions,
    each signature getting its share of k by largest remainder, the blocks of one signature taken
    evenly across the model; sorted. With reduce_layers(header, k, matching_blocks(header, k)) a
    twin of k blocks has the model's type mix as nearly as k blocks allow. Where blocks hold differently named
    tensors (a mixture of experts' leading dense blocks), the twin's block i is the model's block i, so it takes
    its types from a block of the same tensors: the k are apportioned among the blocks of each such kind, as many of
    a kind as the first k blocks hold, and the i-th pick is of block i's kind (picks sorted within a kind)."""
    sigs = layer_signatures(header)
    n = len(sigs)
    if not 1 <= k <= n:
        raise SpecError(f"blocks to keep must be 1..{n}, not {k}")
    kinds = [_kind(sig) for sig in sigs]
    of_kind: dict[tuple, list[int]] = {}
    for i, kind in enumerate(kinds):
        of_kind.setdefault(kind, []).append(i)
    picks = {kind: iter(_apportioned([sigs[i] for i in b], b, kinds[:k].count(kind))) for kind, b in of_kind.items()}
    return [next(picks[kind]) for kind in kinds[:k]]


def leading_blocks(header: Header) -> int:
    """How many blocks at the start are of kinds (tensor names) no later block has: a mixture of experts' leading
    dense blocks (first_k_dense_replace: DeepSeek-V2's and GLM-4.5-Air's 1, DeepSeek-V3's and GLM-4.5's 3); 0 where
    every kind recurs, as a hybrid's convolution or Mamba blocks before its first attention block do (those are the
    layer pattern's, probing.twins.window_period)."""
    kinds = [_kind(sig) for sig in layer_signatures(header)]
    return max(k for k in range(len(kinds)) if not set(kinds[:k]) & set(kinds[k:]))


def _kind(signature: tuple) -> tuple[str, ...]:
    """A block's kind: the names of its tensors (a dense feed-forward's or experts'; shapes and types aside)."""
    return tuple(name for name, _shape, _type in signature)


def _apportioned(sigs: list[tuple], blocks: list[int], k: int) -> list[int]:
    """k of `blocks` (whose signatures are `sigs`), each signature its share of k by largest remainder, the blocks
    of one signature taken evenly; sorted."""
    n = len(blocks)
    groups: dict[tuple, list[int]] = {}
    for block, sig in zip(blocks, sigs):
        groups.setdefault(sig, []).append(block)
    members = list(groups.values())
    exact = [k * len(m) / n for m in members]
    quota = [int(q) for q in exact]
    by_remainder = sorted(range(len(members)), key=lambda g: (-(exact[g] - quota[g]), members[g][0]))
    for g in by_remainder[: k - sum(quota)]:
        quota[g] += 1
    picks = []
    for m, q in zip(members, quota):
        picks += [m[int((j + 0.5) * len(m) / q)] for j in range(q)]
    return sorted(picks)


def reduce_layers(header: Header, n_keep: int, types_from: Sequence[int] | None = None) -> Header:
    """The header of the first `n_keep` blocks: block_count and every per-layer array cut to n_keep;
    block i keeps its own shapes and takes the tensor types of original block `types_from[i]`
    (default: its own). Tensors outside the blocks are kept as they are."""
    n_layer = header.n_layer
    if not 1 <= n_keep <= n_layer:
        raise SpecError(f"blocks to keep must be 1..{n_layer}, not {n_keep}")
    source = list(range(n_keep)) if types_from is None else [int(i) for i in types_from]
    if len(source) != n_keep or any(not 0 <= i < n_layer for i in source):
        raise SpecError(f"types_from must give {n_keep} block indices in 0..{n_layer - 1}, not {list(source)}")
    types: list[dict[str, str]] = [{} for _ in range(n_layer)]
    for t in header.tensors:
        where = _block_of(t.name)
        if where is not None and where[0] < n_layer:
            types[where[0]][where[1]] = t.type
    tensors = []
    for t in header.tensors:
        where = _block_of(t.name)
        if where is None:
            tensors.append(t)
        elif where[0] < n_keep:
            tensors.append(replace(t, type=_borrowed_type(t, where[1], types[source[where[0]]], source[where[0]])))
    return Header(_cut_fields(header, n_keep), tuple(tensors))


def _borrowed_type(t: TensorSpec, suffix: str, types: dict[str, str], block: int) -> str:
    new = types.get(suffix)
    if new is None:
        raise SpecError(f"block {block} has no tensor {suffix!r} to take the type of {t.name} from")
    if t.shape[0] % block_format(new).block_elements:
        raise SpecError(f"{t.name}: a row of {t.shape[0]} cannot hold {new} blocks (the type of block {block})")
    return new


def _cut_fields(header: Header, n_keep: int) -> dict[str, Field]:
    n_layer, prefix = header.n_layer, header.arch + "."
    skip = {header.key(k) for k in _NOT_PER_LAYER}
    fields = {}
    for key, f in header.fields.items():
        if key == header.key(Keys.LLM.BLOCK_COUNT):
            f = replace(f, value=n_keep)
        elif key.startswith(prefix) and key not in skip and f.type == GGUFValueType.ARRAY and len(f.value) == n_layer:
            f = replace(f, value=f.value[:n_keep])
        fields[key] = f
    if header.arch in _Q_DIRECT and header.key(_Q_DIRECT[header.arch]) not in fields:
        fields[header.key(_Q_DIRECT[header.arch])] = Field.u32(0)
    return fields


def quantized_header(header: Header, qtype: str, *, pure: bool = False) -> Header:
    """`header` (a float model's: F16, BF16 or F32 matrices) as llama.cpp's quantizer would write it
    in file type `qtype` ("Q4_K_M", "Q8_0", ...): each tensor's type from the quantizer's dry run on
    a sparse copy (nothing quantized, no data written), in the quantizer's tensor order, with
    general.file_type and quantization_version set as it sets them. QuantError for an unknown type
    or a refusal. Give the header of the whole model, then reduce_layers the result: the quantizer
    picks some layers' types by their place in the depth (Q4_K_M's extra bits in attn_v and ffn_down)."""
    from ondevice.llama.quantize import supports_file_type, tensor_types

    ftype = file_type(qtype, header_only=True)
    quantized = sorted({t.type for t in header.tensors if block_format(t.type).is_quantized})
    if quantized:
        raise QuantError(
            f"the header is already quantized ({', '.join(quantized)}); a file type applies to a float model's header "
            "(F16, BF16 or F32 matrices, as from a config.json)"
        )
    if not supports_file_type(ftype.name, ftype.value):
        raise QuantError(f"this llama.cpp build does not support {qtype}")
    with tempfile.TemporaryDirectory(prefix="ondevice-twin-") as folder:
        src = write_twin(header, Path(folder) / "source.gguf", sparse=True)
        rc, types = tensor_types(src, ftype.value, pure=pure)
    missing = [t.name for t in header.tensors if t.name not in types]
    if rc != 0 or missing:
        raise QuantError(f"llama.cpp's quantizer refused {qtype} for this header (status {rc}, {len(missing)} tensors)")
    fields = {
        k: f for k, f in header.fields.items() if k not in (Keys.General.QUANTIZATION_VERSION, Keys.General.FILE_TYPE)
    }
    fields[Keys.General.QUANTIZATION_VERSION] = Field.u32(GGML_QUANT_VERSION)
    fields[Keys.General.FILE_TYPE] = Field.u32(ftype.value)
    tensors = sorted(header.tensors, key=_quantizer_order)
    return Header(fields, tuple(replace(t, type=types[t.name]) for t in tensors))


def _quantizer_order(t: TensorSpec) -> tuple[int, str]:
    """The order llama.cpp's quantizer writes tensors in: those outside blocks first, then block by
    block; by name within each."""
    where = _block_of(t.name)
    return (-1 if where is None else where[0], t.name)


@dataclass(frozen=True)
class ModelData:
    """A model file whose own tensor data a twin of it copies, where a twin tensor and the model's tensor it stands
    for (`origin`) have the same type and size. `blocks`: for a twin reduce_layers(header, k, blocks), the model's
    block each twin block copies (empty: every tensor its namesake). Twin data is random otherwise; with its model's
    bytes, a twin holds its values too, and these move speed on x86 (ggml converts block scales through a lookup
    table whose cache misses depend on them: docs/twins.md)."""

    path: Path
    blocks: tuple[int, ...] = ()

    def origin(self, name: str) -> str:
        """The model's tensor that twin tensor `name` stands for."""
        where = _block_of(name)
        if not self.blocks or where is None:
            return name
        return f"blk.{self.blocks[where[0]]}.{where[1]}"


def write_twin(
    header: Header,
    path: str | Path,
    *,
    seed: int = 0,
    sparse: bool = False,
    durable: bool = True,
    model: ModelData | None = None,
) -> Path:
    """Write a GGUF of `header` with valid random data of each tensor's type (ondevice.quant.twindata),
    atomically; return the path. Same header and seed, same bytes. `sparse`: the header only, the
    data region a hole of its full size (for tools that read headers, like the quantizer's dry run).
    `durable`: flushed to disk before it is renamed into place (False: a scratch twin, timed and removed).
    `model`: the model's own file, whose tensors' bytes are copied wherever they fit (ModelData)."""
    path = Path(path)
    raw = encode_header(header)
    start, offsets = data_layout(header, len(raw))
    ends = [start + off + t.n_bytes for t, off in zip(header.tensors, offsets)]
    total = max(ends, default=start)
    total = -(-total // header.alignment) * header.alignment if header.tensors else start
    with paths.atomic_path(path, durable=durable) as tmp, open(tmp, "r+b") as out:
        out.write(raw)
        if not sparse:
            own = _model_tensors(header, model) if model is not None else {}
            _write_data(out, header, start, offsets, np.random.default_rng(seed), own)
        out.truncate(total)
    return path


def _model_tensors(header: Header, model: ModelData) -> dict[str, tuple[Path, int]]:
    """Twin tensor name -> (file, offset) of the model's tensor it copies, for those of the same type and size."""
    from ondevice.gguf.reader import read_gguf

    model_file = read_gguf(model.path)
    theirs = {t.name: t for t in model_file.tensors}
    found = {}
    for t in header.tensors:
        source = theirs.get(model.origin(t.name))
        if source is not None and source.type_name == t.type and source.n_bytes == t.n_bytes:
            found[t.name] = (model_file.files[source.split].path, source.offset)
    return found


def _write_data(out, header: Header, start: int, offsets: list[int], rng, own: Mapping[str, tuple[Path, int]]) -> None:
    pools: dict[tuple[str, bool], np.ndarray] = {}
    for t, offset in zip(header.tensors, offsets):
        out.seek(start + offset)
        if t.name in own:
            _copy_bytes(out, *own[t.name], t.n_bytes)
            continue
        gain = is_gain(t.name)
        if (t.type, gain) not in pools:
            pools[t.type, gain] = gain_pool(t.type, rng) if gain else block_pool(t.type, rng)
        pool = pools[t.type, gain]
        step = block_format(t.type).block_bytes
        write_tiled(out, pool, t.n_bytes, start=int(rng.integers(0, pool.size // step)) * step)


def _copy_bytes(out, source: Path, offset: int, n_bytes: int) -> None:
    with open(source, "rb") as f:
        f.seek(offset)
        left = n_bytes
        while left:
            chunk = f.read(min(left, CHUNK_BYTES))
            if not chunk:
                raise QuantError(f"{source} ended {left} bytes early, in a tensor a twin copies from it")
            out.write(chunk)
            left -= len(chunk)


def split_outside_blocks(header: Header) -> tuple[Header, Header]:
    """`header` as a model split in two files (llama.cpp's gguf-split keys): the first with every key and the
    blocks' tensors, the second with the tensors outside the blocks (the token embedding, the output head and
    norm) and no key but its place and general.alignment. The second depends on those tensors alone: twins of one
    model with different block counts share it (written once, each twin's name linked to it)."""
    inside = tuple(t for t in header.tensors if _block_of(t.name) is not None)
    outside = tuple(t for t in header.tensors if _block_of(t.name) is None)
    kept = {key: f for key, f in header.fields.items() if not key.startswith(SPLIT_KEY_PREFIX)}
    first = {
        **kept,
        **_split_fields(0),
        Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT: Field(GGUFValueType.INT32, len(header.tensors)),
    }
    second = _split_fields(1)
    if Keys.General.ALIGNMENT in header.fields:
        second = {Keys.General.ALIGNMENT: header.fields[Keys.General.ALIGNMENT], **second}
    return Header(first, inside), Header(second, outside)


def _split_fields(no: int) -> dict[str, Field]:
    """The keys that place a file among two (the types llama.cpp reads them as)."""
    return {
        Keys.Split.LLM_KV_SPLIT_NO: Field(GGUFValueType.UINT16, no),
        Keys.Split.LLM_KV_SPLIT_COUNT: Field(GGUFValueType.UINT16, 2),
    }


def header_spec(header: Header):
    """The ModelSpec of a header (ondevice.gguf.spec), read from a sparse twin written for the purpose: no file
    stays behind, so the spec has no path."""
    from ondevice.gguf.spec import inspect

    with tempfile.TemporaryDirectory(prefix="ondevice-header-") as folder:
        path = write_twin(header, Path(folder) / "header.gguf", sparse=True)
        return replace(inspect(path), path=None)
