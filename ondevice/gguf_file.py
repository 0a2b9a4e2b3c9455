"""A lean, bounds-checked reader of a GGUF file's header (metadata + tensor table).

Built on the `gguf` package's own tables (value types, quant block sizes, magic), but
it walks the header itself: gguf.GGUFReader materialises a numpy view per string and
takes tens of seconds on a 262k-token vocabulary, and trusts counts and offsets that a
malformed file can set to anything. Here every length, count and offset is checked
against the file size before it is used, so a bad file raises GGUFFormatError and can
never reach llama.cpp. Large arrays (the vocabulary) are kept as references and only
decoded on request.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFReader, GGUFValueType, Keys

from ondevice.errors import GGUFFormatError, ModelNotFoundError

__all__ = ["GGUFFile", "TensorInfo", "ArrayRef", "read_gguf"]

_SCALAR_DTYPES = {vt: np.dtype(t).newbyteorder("<") for vt, t in GGUFReader.gguf_scalar_to_np.items()}
_MAX_DIMS = 4  # GGML_MAX_DIMS
_SMALL_ARRAY = 64  # arrays up to this many items are decoded eagerly
_MAX_NESTING = 4


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array left undecoded (too large to be worth it up front)."""

    item_type: GGUFValueType  # element type
    count: int  # number of elements
    offset: int  # byte offset of the first element in the file
    nbytes: int  # bytes the array occupies in the header

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (ne0)
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int  # bytes of data

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int  # GGUF format version (2 or 3)
    file_bytes: int  # size of the file
    alignment: int  # tensor data alignment in bytes
    data_offset: int  # byte offset where tensor data starts
    metadata: dict[str, Any]  # key -> scalar, str, list (small arrays) or ArrayRef
    tensors: tuple[TensorInfo, ...]  # in file order

    @property
    def tensor_data_bytes(self) -> int:
        """Bytes from data_offset to the end of the file (tensor data + padding)."""
        return self.file_bytes - self.data_offset

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def read_array(self, ref: ArrayRef) -> list[Any] | np.ndarray:
        """Decode an ArrayRef: a numpy array for numbers, a list of str for strings.

        Strings are decoded losslessly (invalid UTF-8 as surrogate escapes), so distinct
        byte strings stay distinct, as llama.cpp sees them."""
        with _Cursor.open(self.path, text_errors="surrogateescape") as cur:
            cur.pos = ref.offset
            return cur.array_items(ref.item_type, ref.count, depth=1, eager=True)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate a GGUF header; raise GGUFFormatError on any inconsistency."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFFormatError(f"{path}: is a directory, not a GGUF file")
    try:
        with _Cursor.open(path) as cur:
            return _parse(path, cur)
    except GGUFFormatError:
        raise
    except (struct.error, ValueError, OverflowError, IndexError) as exc:
        raise GGUFFormatError(f"{path}: malformed GGUF header ({exc})") from None
    except OSError as exc:
        raise GGUFFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None


class _Cursor:
    def __init__(self, path: Path, buf: memoryview | bytes, size: int, closer, text_errors: str = "replace"):
        self.path, self.buf, self.size, self.pos, self._closer = path, buf, size, 0, closer
        self.text_errors = text_errors  # how invalid UTF-8 in strings is decoded

    @classmethod
    def open(cls, path: Path, text_errors: str = "replace") -> "_Cursor":
        handle = open(path, "rb")
        size = path.stat().st_size
        if size == 0:
            handle.close()
            return cls(path, b"", 0, lambda: None, text_errors)
        mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)

        def closer():
            mm.close()
            handle.close()

        return cls(path, mm, size, closer, text_errors)

    def __enter__(self) -> "_Cursor":
        return self

    def __exit__(self, *exc) -> None:
        self._closer()

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated or corrupt header: {what} needs {n} bytes")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors=self.text_errors)

    def skip_string(self, what: str) -> None:
        n = self.u64(f"{what} length")
        self.need(n, what)
        self.pos += n

    def value(self, vtype: int, what: str, depth: int) -> Any:
        vt = _value_type(self, vtype, what)
        if vt == GGUFValueType.STRING:
            return self.string(what)
        if vt == GGUFValueType.ARRAY:
            if depth >= _MAX_NESTING:
                raise self.fail(f"{what}: arrays nested too deep")
            item_type = _value_type(self, self.u32(f"{what} item type"), what)
            count = self.u64(f"{what} count")
            return self.array(item_type, count, what, depth + 1)
        dtype = _SCALAR_DTYPES[vt]
        self.need(dtype.itemsize, what)
        value = np.frombuffer(self.buf, dtype=dtype, count=1, offset=self.pos)[0].item()
        self.pos += dtype.itemsize
        return value

    def array(self, item_type: GGUFValueType, count: int, what: str, depth: int) -> Any:
        min_item = 8 if item_type in (GGUFValueType.STRING, GGUFValueType.ARRAY) else _SCALAR_DTYPES[item_type].itemsize
        if count * min_item > self.size - self.pos:
            raise self.fail(f"{what}: array of {count} items cannot fit in the file")
        start = self.pos
        if count <= _SMALL_ARRAY:
            items = self.array_items(item_type, count, depth, eager=True)
            return list(items) if isinstance(items, np.ndarray) else items
        self.array_items(item_type, count, depth, eager=False)
        return ArrayRef(item_type=item_type, count=count, offset=start, nbytes=self.pos - start)

    def array_items(self, item_type: GGUFValueType, count: int, depth: int, eager: bool) -> Any:
        if item_type == GGUFValueType.STRING:
            if not eager:
                for _ in range(count):
                    self.skip_string("array string")
                return None
            return [self.string("array string") for _ in range(count)]
        if item_type == GGUFValueType.ARRAY:
            return [self.value(GGUFValueType.ARRAY, "nested array", depth) for _ in range(count)]
        dtype = _SCALAR_DTYPES[item_type]
        nbytes = dtype.itemsize * count
        self.need(nbytes, "array data")
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy() if eager else None
        self.pos += nbytes
        if out is not None and item_type == GGUFValueType.BOOL:
            out = out.astype(bool)
        return [x.item() for x in out] if (eager and count <= _SMALL_ARRAY) else out


def _value_type(cur: _Cursor, vtype: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(vtype)
    except ValueError:
        raise cur.fail(f"{what}: unknown value type {vtype}") from None


def _parse(path: Path, cur: _Cursor) -> GGUFFile:
    if cur.size < 4 or struct.unpack_from("<I", cur.buf, 0)[0] != GGUF_MAGIC:
        head = bytes(cur.buf[:4]) if cur.size else b""
        raise GGUFFormatError(f"{path}: not a GGUF file (magic {head!r}, expected b'GGUF')")
    cur.pos = 4
    version = cur.u32("version")
    if version not in (2, 3):
        if struct.unpack(">I", struct.pack("<I", version))[0] in (2, 3):
            raise GGUFFormatError(f"{path}: big-endian GGUF is not supported")
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version}")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # Each KV needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
    if n_kv * 13 + n_tensors * 32 > cur.size:
        raise cur.fail(f"header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file holds")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        metadata[key] = cur.value(cur.u32(f"type of {key!r}"), f"value of {key!r}", depth=0)
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"{path}: {Keys.General.ALIGNMENT} {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = tuple(_place(path, cur.size, data_offset, alignment, info) for info in infos)
    _check_overlap(path, tensors)
    return GGUFFile(path, version, cur.size, alignment, data_offset, metadata, tensors)


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cur.string("tensor name")
    n_dims = cur.u32(f"dims of {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1..{_MAX_DIMS} allowed)")
    shape = tuple(cur.u64(f"shape of {name!r}") for _ in range(n_dims))
    if any(d <= 0 or d >= 1 << 40 for d in shape):
        raise cur.fail(f"tensor {name!r} has an impossible shape {shape}")
    raw_type = cur.u32(f"type of {name!r}")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise cur.fail(f"tensor {name!r} has unknown type {raw_type}") from None
    if ggml_type not in GGML_QUANT_SIZES:
        raise cur.fail(f"tensor {name!r} has type {ggml_type.name} with no known block size")
    offset = cur.u64(f"offset of {name!r}")
    return name, shape, ggml_type, offset


def _place(path: Path, file_bytes: int, data_offset: int, alignment: int, info) -> TensorInfo:
    name, shape, ggml_type, rel_offset = info
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if shape[0] % block_size:
        raise GGUFFormatError(f"{path}: tensor {name!r} row length {shape[0]} is not a multiple of the {ggml_type.name} block size {block_size}")
    n_elements = int(np.prod(shape, dtype=object))
    n_bytes = n_elements // block_size * type_size
    if rel_offset % alignment:
        raise GGUFFormatError(f"{path}: tensor {name!r} offset {rel_offset} is not aligned to {alignment}")
    end = data_offset + rel_offset + n_bytes
    if end > file_bytes:
        raise GGUFFormatError(
            f"{path}: truncated: tensor {name!r} ends at byte {end} but the file has {file_bytes} bytes"
        )
    return TensorInfo(name=name, shape=shape, ggml_type=ggml_type, offset=data_offset + rel_offset, n_bytes=n_bytes)


def _check_overlap(path: Path, tensors: tuple[TensorInfo, ...]) -> None:
    names = set()
    for t in tensors:
        if t.name in names:
            raise GGUFFormatError(f"{path}: duplicate tensor name {t.name!r}")
        names.add(t.name)
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.n_bytes > b.offset:
            raise GGUFFormatError(f"{path}: tensors {a.name!r} and {b.name!r} overlap")
