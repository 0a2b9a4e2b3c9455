"""A GGUF header as data: typed metadata and tensor descriptions, read from a file or built, and
written back byte for byte.

`read_header` keeps every key's GGUF value type (uint32 stays uint32, arrays keep their item type)
and every string's bytes (invalid UTF-8 included, as surrogate escapes), so a header read and
written again is the same bytes up to the tensor data. The walk is the bounded one of
ondevice.gguf.cursor (counts and lengths checked against the file before use); the tensor table
comes from ondevice.gguf.reader (offsets, sizes and overlaps checked). No tensor data is read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFReader, GGUFValueType, Keys
from ondevice.quant.formats import block_format

from ondevice.core.errors import SpecError
from ondevice.gguf.cursor import Cursor
from ondevice.gguf.reader import read_gguf

__all__ = [
    "Field",
    "TensorSpec",
    "Header",
    "read_header",
    "encode_header",
    "data_layout",
    "GGUF_VERSION",
    "SPLIT_KEY_PREFIX",
]

GGUF_VERSION = 3  # the version written
_SCALAR = {vt: np.dtype(t).newbyteorder("<") for vt, t in GGUFReader.gguf_scalar_to_np.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
SPLIT_KEY_PREFIX = "split."  # gguf-split's keys (Keys.Split): where a file sits among a split model's


@dataclass(frozen=True)
class Field:
    """One metadata value with its GGUF type. Scalars are int/float/bool, strings str; an ARRAY's
    value is a tuple of its items (of `item_type`; an array of arrays holds Fields)."""

    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None

    @classmethod
    def u32(cls, value: int) -> Field:
        return cls(GGUFValueType.UINT32, int(value))

    @classmethod
    def f32(cls, value: float) -> Field:
        return cls(GGUFValueType.FLOAT32, float(value))

    @classmethod
    def string(cls, value: str) -> Field:
        return cls(GGUFValueType.STRING, str(value))

    @classmethod
    def boolean(cls, value: bool) -> Field:
        return cls(GGUFValueType.BOOL, bool(value))

    @classmethod
    def array(cls, items: Any, item_type: GGUFValueType) -> Field:
        return cls(GGUFValueType.ARRAY, tuple(items), item_type)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor without its data: name, shape in GGUF (ne) order, ggml type name ("Q4_K")."""

    name: str
    shape: tuple[int, ...]  # ne order: shape[0] is the row length
    type: str

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def n_bytes(self) -> int:
        return block_format(self.type).tensor_bytes(self.shape)


@dataclass(frozen=True)
class Header:
    """A GGUF's metadata (in file order) and its tensors (in file order). Treat `fields` as read-only:
    helpers that change a header return a new one."""

    fields: Mapping[str, Field]
    tensors: tuple[TensorSpec, ...]

    @property
    def arch(self) -> str:
        value = self.value(Keys.General.ARCHITECTURE)
        if not isinstance(value, str) or not value:
            raise SpecError(f"the header has no {Keys.General.ARCHITECTURE} string")
        return value

    @property
    def n_layer(self) -> int:
        key = Keys.LLM.BLOCK_COUNT.format(arch=self.arch)
        value = self.value(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"the header has no positive {key}")
        return value

    def value(self, key: str, default: Any = None) -> Any:
        found = self.fields.get(key)
        return default if found is None else found.value

    def key(self, template: str) -> str:
        """A gguf.Keys template ("{arch}.block_count") for this header's architecture."""
        return template.format(arch=self.arch)

    @property
    def alignment(self) -> int:
        value = self.value(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise SpecError(f"{Keys.General.ALIGNMENT} {value!r} is not a power of two")
        return value


# ---------- reading ----------


def read_header(path: str | Path) -> Header:
    """The metadata (with value types) and tensor table of a GGUF file. GGUFFormatError /
    ModelNotFoundError on a file that is not a well-formed GGUF. Of a split model (path: its first file),
    the model's header as one file: the first file's metadata less the split.* keys, every file's tensors."""
    path = Path(path)
    g = read_gguf(path)  # validates the whole header, tensor offsets and sizes included
    with Cursor.open(path, text_errors="surrogateescape") as cur:
        cur.pos = 24  # magic, version, tensor count, metadata count
        fields = {}
        for _ in range(len(g.metadata)):
            key = cur.string("metadata key")
            fields[key] = _read_value(cur, cur.value_type(cur.u32(f"type of {key!r}"), key), key, depth=0)
    if g.parts:
        fields = {key: f for key, f in fields.items() if not key.startswith(SPLIT_KEY_PREFIX)}
    tensors = tuple(TensorSpec(t.name, tuple(int(d) for d in t.shape), t.type_name) for t in g.tensors)
    return Header(fields, tensors)


def _read_value(cur: Cursor, vt: GGUFValueType, what: str, depth: int) -> Field:
    if vt == GGUFValueType.STRING:
        return Field(vt, cur.string(what))
    if vt != GGUFValueType.ARRAY:
        return Field(vt, cur.value(int(vt), what))
    item_type = cur.value_type(cur.u32(f"{what} item type"), what)
    count = cur.u64(f"{what} count")
    cur.admit(item_type, count, what, depth + 1)
    if item_type == GGUFValueType.ARRAY:
        items: Any = tuple(_read_value(cur, GGUFValueType.ARRAY, what, depth + 1) for _ in range(count))
    else:
        decoded = cur.items(item_type, count, depth + 1)
        items = tuple(decoded.tolist() if isinstance(decoded, np.ndarray) else decoded)
    return Field(GGUFValueType.ARRAY, items, item_type)


# ---------- writing ----------


def encode_header(header: Header) -> bytes:
    """The bytes of a GGUF v3 header for `header` (magic to the last tensor info, no padding); the
    tensor data offsets are data_layout's."""
    _check_tensors(header)
    out = bytearray(b"".join((_U32.pack(GGUF_MAGIC), _U32.pack(GGUF_VERSION))))
    out += _U64.pack(len(header.tensors)) + _U64.pack(len(header.fields))
    for key, field in header.fields.items():
        out += _string(key) + _U32.pack(int(field.type)) + _encode_value(field, key)
    _, offsets = data_layout(header)
    for t, offset in zip(header.tensors, offsets):
        out += _string(t.name) + _U32.pack(len(t.shape)) + b"".join(_U64.pack(d) for d in t.shape)
        out += _U32.pack(int(block_format(t.type).ggml_type)) + _U64.pack(offset)
    return bytes(out)


def data_layout(header: Header, header_bytes: int | None = None) -> tuple[int, list[int]]:
    """(data start, each tensor's offset from it): tensors one after another, each padded to the
    alignment, as gguf-py and llama.cpp write them. Without `header_bytes` the start is 0."""
    align = header.alignment
    start = -(-header_bytes // align) * align if header_bytes is not None else 0
    offsets, at = [], 0
    for t in header.tensors:
        offsets.append(at)
        at += -(-t.n_bytes // align) * align
    return start, offsets


def _check_tensors(header: Header) -> None:
    seen: set[str] = set()
    for t in header.tensors:
        if t.name in seen:
            raise SpecError(f"tensor {t.name!r} appears twice")
        seen.add(t.name)
        if not 1 <= len(t.shape) <= 4 or any(int(d) < 1 for d in t.shape):
            raise SpecError(f"tensor {t.name!r} has an impossible shape {t.shape}")
        fmt = block_format(t.type)
        if t.shape[0] % fmt.block_elements:
            raise SpecError(
                f"tensor {t.name!r}: a row of {t.shape[0]} is not a whole number of {t.type} blocks "
                f"({fmt.block_elements} weights)"
            )


def _string(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return _U64.pack(len(raw)) + raw


def _encode_value(field: Field, what: str) -> bytes:
    vt = field.type
    if vt == GGUFValueType.STRING:
        return _string(field.value)
    if vt != GGUFValueType.ARRAY:
        return np.array([field.value], dtype=_SCALAR[vt]).tobytes()
    if field.item_type is None:
        raise SpecError(f"metadata {what!r}: an array without an item type")
    items = field.value
    head = _U32.pack(int(field.item_type)) + _U64.pack(len(items))
    if field.item_type == GGUFValueType.STRING:
        return head + b"".join(_strings(items))
    if field.item_type == GGUFValueType.ARRAY:
        return head + b"".join(_encode_value(f, what) for f in items)  # each: its item type, count, items
    return head + np.asarray(items, dtype=_SCALAR[field.item_type]).tobytes()


def _strings(items) -> Iterator[bytes]:
    pack = _U64.pack
    for text in items:
        raw = text.encode("utf-8", "surrogateescape")
        yield pack(len(raw))
        yield raw
