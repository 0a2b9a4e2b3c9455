"""GGUF files built byte by byte for the hostile-input tests.

`split` takes a well-formed file apart (raw metadata entries, tensor infos and data, via the
`gguf` package's reader); the tests change the parts and `join` lays them out again the way
gguf.cpp expects (each tensor's data padded to the alignment, offsets in file order), unless a
test asks for stale or false offsets. The encoders write any value, also ones no writer would:
nested arrays, counts that lie, unknown type ids.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGUF_MAGIC, GGUFReader, GGUFValueType

__all__ = ["Tensor", "Parts", "split", "offsets", "join", "kv", "string", "scalar", "array", "SCALAR_DTYPES"]

# little-endian numpy dtype of each scalar value type, from the gguf package's table
SCALAR_DTYPES = {vt: np.dtype(t).newbyteorder("<") for vt, t in GGUFReader.gguf_scalar_to_np.items()}


@dataclass
class Tensor:
    name: bytes  # raw name bytes
    dims: list[int]  # ggml order (dims[0] is the row length), written as u64 each
    type_id: int  # ggml type id, written as u32
    data: bytes  # the tensor's data
    offset: int | None = None  # offset to write in the table; None: where join places the data


@dataclass
class Parts:
    version: int  # GGUF version
    kvs: list[bytes]  # raw metadata entries (key, type, value), in file order
    tensors: list[Tensor] = field(default_factory=list)  # in file order

    def copy(self) -> Parts:
        return Parts(self.version, list(self.kvs), [replace(t, dims=list(t.dims)) for t in self.tensors])


def split(path: str | Path) -> Parts:
    r = GGUFReader(path)
    kvs = [b"".join(p.tobytes() for p in f.parts) for f in r.fields.values() if f.offset >= 24]
    tensors = [
        Tensor(t.name.encode(), [int(d) for d in t.shape], int(t.tensor_type), t.data.tobytes()) for t in r.tensors
    ]
    return Parts(int(r.fields["GGUF.version"].parts[0][0]), kvs, tensors)


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def offsets(parts: Parts, layout_alignment: int = 32) -> list[int]:
    """Where join places each tensor's data, relative to the data section (gguf.cpp's layout)."""
    placed, rel = [], 0
    for t in parts.tensors:
        placed.append(rel)
        rel = _pad(rel + len(t.data), layout_alignment)
    return placed + [rel]


def join(parts: Parts, layout_alignment: int = 32, n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    """The file's bytes: the data section starts at the header end padded to `layout_alignment`, each
    tensor's data padded to it too (gguf.cpp's layout). n_kv / n_tensors override the counts."""
    out = bytearray(
        struct.pack(
            "<IIQQ",
            GGUF_MAGIC,
            parts.version,
            len(parts.tensors) if n_tensors is None else n_tensors,
            len(parts.kvs) if n_kv is None else n_kv,
        )
    )
    for entry in parts.kvs:
        out += entry
    *placed, rel = offsets(parts, layout_alignment)
    for t, at in zip(parts.tensors, placed):
        out += string(t.name) + struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<Q", d) for d in t.dims)
        out += struct.pack("<IQ", t.type_id, at if t.offset is None else t.offset)
    if parts.tensors:  # gguf.cpp pads the header only when tensor data follows
        out += bytes(_pad(len(out), layout_alignment) - len(out))
    data = bytearray(rel)
    for t, at in zip(parts.tensors, placed):
        data[at : at + len(t.data)] = t.data
    return bytes(out + data)


def string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def scalar(vtype: GGUFValueType, value) -> bytes:
    return np.array([value], dtype=SCALAR_DTYPES[vtype]).tobytes()


def array(item_type: int, items: list[bytes], count: int | None = None) -> bytes:
    """An array body: item type, count (default: len(items)), then the encoded items."""
    return struct.pack("<IQ", item_type, len(items) if count is None else count) + b"".join(items)


def kv(key: str | bytes, vtype: int, body: bytes) -> bytes:
    """A metadata entry: key, value type, and the value's encoded body."""
    return string(key) + struct.pack("<I", vtype) + body
