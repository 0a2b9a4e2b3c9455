"""A lean, bounds-checked reader of a GGUF file's header (metadata + tensor table).

Built on the `gguf` package's own tables (value types, quant block sizes, magic), but
it walks the header itself: gguf.GGUFReader materialises a numpy view per string and
takes tens of seconds on a 262k-token vocabulary, and trusts counts and offsets that a
malformed file can set to anything. Here every length, count and offset is checked
against the file size before it is used, so a bad file raises GGUFFormatError and can
never reach llama.cpp, and the work a header can ask for is bounded by the file
(ondevice.gguf.cursor). Large arrays (the vocabulary) and arrays of arrays are kept as
references and only decoded on request. Paths that are not regular files (FIFOs, devices)
are refused before they are opened.

A model split over several files (llama.cpp's gguf-split: `name-00001-of-00003.gguf` and on) is read
from its first file, as llama.cpp loads it: the other files are found by that name, each checked as
llama.cpp checks them (its split.no, no tensor named twice, the tensor count the first file gives), and
the model's tensors are all of theirs (`GGUFFile.files` holds each file's own header).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType, Keys

from ondevice.core.errors import GGUFFormatError, ModelNotFoundError
from ondevice.gguf.cursor import ArrayRef, Cursor, not_regular_reason

__all__ = [
    "GGUFFile",
    "TensorInfo",
    "ArrayRef",
    "read_gguf",
    "split_path",
    "split_paths",
    "model_files",
    "MAX_METADATA_ENTRIES",
    "MAX_TENSORS",
]

_MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_METADATA_ENTRIES = 1 << 16  # key/value pairs in one header (real models: a few dozen)
MAX_TENSORS = 1 << 16  # tensors in one file (the largest real models: a few thousand)
MAX_SPLITS = (1 << 16) - 1  # llama.cpp reads split.count as a uint16
_SPLIT_NAME = "-{no:05d}-of-{count:05d}.gguf"  # llama.cpp's llama_split_path: prefix + this, `no` counted from 1
_FIRST_SPLIT = re.compile(r".-00001-of-(\d{5})\.gguf$")  # the first of a split model's files, by that naming


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (ne0)
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset of the data in its file
    n_bytes: int  # bytes of data
    split: int = 0  # the file of a split model that holds it (GGUFFile.files[split]); 0 for one file

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
    tensors: tuple[TensorInfo, ...]  # the model's, in file order (of a split model: every file's, file by file)
    parts: tuple[GGUFFile, ...] = ()  # a split model's files, each with its own tensors alone; () for one file

    @property
    def files(self) -> tuple[GGUFFile, ...]:
        """Each file of the model with its own tensors: this one alone, or a split model's files in order."""
        return self.parts or (self,)

    @property
    def model_file_bytes(self) -> int:
        """Bytes of every file of the model."""
        return sum(f.file_bytes for f in self.files)

    @property
    def header_bytes(self) -> int:
        """Bytes before the tensor data, in every file of the model."""
        return sum(f.data_offset for f in self.files)

    @property
    def tensor_data_bytes(self) -> int:
        """Bytes from data_offset to the end of each file (tensor data + padding), every file of the model."""
        return sum(f.file_bytes - f.data_offset for f in self.files)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def read_array(self, ref: ArrayRef) -> list[Any] | np.ndarray:
        """Decode an ArrayRef: a numpy array for numbers, a list of str for strings, and for
        an array of arrays the list of its arrays (each a list if small, else an ArrayRef).

        Strings are decoded losslessly (invalid UTF-8 as surrogate escapes), so distinct
        byte strings stay distinct, as llama.cpp sees them."""
        with Cursor.open(self.path, text_errors="surrogateescape") as cur:
            cur.pos = ref.offset
            cur.admit(ref.item_type, ref.count, "array", ref.depth)
            return cur.items(ref.item_type, ref.count, ref.depth)

    def read_strings(self, ref: ArrayRef) -> list[str]:
        """Decode an ArrayRef of strings as read_array does; GGUFFormatError when its items are not strings."""
        if ref.item_type != GGUFValueType.STRING:
            raise GGUFFormatError(f"{self.path}: expected an array of strings, found one of {ref.item_type.name}")
        with Cursor.open(self.path, text_errors="surrogateescape") as cur:
            cur.pos = ref.offset
            cur.admit(ref.item_type, ref.count, "array", ref.depth)
            return cur.strings(ref.count)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate a GGUF header (of a split model, every file's); raise GGUFFormatError on any
    inconsistency, ModelNotFoundError when the file or one of its splits is not there."""
    first = _read_file(Path(path))
    count = first.get(Keys.Split.LLM_KV_SPLIT_COUNT, 0)
    if not isinstance(count, int) or isinstance(count, bool) or count <= 1:
        return first
    return _join_splits(first, count)


def split_path(prefix: str | Path, no: int, count: int) -> Path:
    """The path of file `no` (from 0) of a model split in `count` (llama.cpp's llama_split_path):
    split_path("dir/name", 0, 3) is dir/name-00001-of-00003.gguf."""
    return Path(f"{prefix}{_SPLIT_NAME.format(no=no + 1, count=count)}")


def model_files(path: str | Path) -> list[Path]:
    """Every file of the model opened by `path`, by name alone (nothing is read): a split model's first file
    (name-00001-of-00003.gguf) gives it and its siblings, present or not; any other path gives [path]. What
    depends on a model's bytes (a check's verdict, its page cache) depends on all of them."""
    path = Path(path)
    first = _FIRST_SPLIT.search(path.name)
    count = int(first.group(1)) if first else 1
    return split_paths(path, count) if count > 1 else [path]


def split_paths(path: str | Path, count: int) -> list[Path]:
    """The files of a model split in `count`, from its first file's path (llama.cpp's naming:
    name-00001-of-00003.gguf, name-00002-of-00003.gguf, ...). GGUFFormatError when the path is not named so."""
    path = Path(path)
    postfix = _SPLIT_NAME.format(no=1, count=count)
    if not path.name.endswith(postfix) or len(path.name) == len(postfix):
        raise GGUFFormatError(
            f"{path}: the first of {count} split files must be named <name>{postfix} (llama.cpp finds the others by it)"
        )
    prefix = str(path)[: -len(postfix)]
    return [split_path(prefix, no, count) for no in range(count)]


def _read_file(path: Path) -> GGUFFile:
    """One file's header, parsed and validated."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelNotFoundError(f"{path}: no such file") from None
    except OSError as exc:
        raise GGUFFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    reason = not_regular_reason(mode)  # a FIFO would block the open; a device or directory has no header
    if reason:
        raise GGUFFormatError(f"{path}: {reason}")
    try:
        with Cursor.open(path) as cur:
            return _parse(path, cur)
    except GGUFFormatError:
        raise
    except (struct.error, ValueError, OverflowError, IndexError) as exc:
        raise GGUFFormatError(f"{path}: malformed GGUF header ({exc})") from None
    except OSError as exc:
        raise GGUFFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _join_splits(first: GGUFFile, count: int) -> GGUFFile:
    """A split model from its first file: the others read and checked as llama.cpp's loader checks them."""
    where = first.path
    if count > MAX_SPLITS:
        raise GGUFFormatError(f"{where}: {Keys.Split.LLM_KV_SPLIT_COUNT} {count} is more than {MAX_SPLITS}")
    no = first.get(Keys.Split.LLM_KV_SPLIT_NO)
    if no != 0:
        raise GGUFFormatError(
            f"{where}: {Keys.Split.LLM_KV_SPLIT_NO} is {no!r} in a model split in {count}; "
            "a split model is opened by its first file (split.no 0)"
        )
    parts = [first]
    for no, path in enumerate(split_paths(where, count)[1:], start=1):
        if not path.exists():
            raise ModelNotFoundError(f"{where}: split {no + 1} of {count} is missing ({path.name})")
        part = _read_file(path)
        if part.get(Keys.Split.LLM_KV_SPLIT_NO) != no:
            raise GGUFFormatError(
                f"{path}: {Keys.Split.LLM_KV_SPLIT_NO} is {part.get(Keys.Split.LLM_KV_SPLIT_NO)!r}, expected {no}"
            )
        parts.append(replace(part, tensors=tuple(replace(t, split=no) for t in part.tensors)))
    tensors = tuple(t for part in parts for t in part.tensors)
    expected = first.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if expected != len(tensors):
        raise GGUFFormatError(
            f"{where}: {Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT} is {expected!r} but the {count} files hold "
            f"{len(tensors)} tensors"
        )
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise GGUFFormatError(f"{where}: tensor {t.name!r} is in more than one of its {count} split files")
        seen.add(t.name)
    return replace(first, tensors=tensors, parts=tuple(parts))


def _parse(path: Path, cur: Cursor) -> GGUFFile:
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
    # Each KV needs >= 8 (key len) + 1 (key) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
    if n_kv * 14 + n_tensors * 32 > cur.size:
        raise cur.fail(f"header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file holds")
    if n_kv > MAX_METADATA_ENTRIES or n_tensors > MAX_TENSORS:
        raise cur.fail(
            f"header claims {n_kv} metadata entries and {n_tensors} tensors "
            f"(at most {MAX_METADATA_ENTRIES} and {MAX_TENSORS})"
        )
    metadata = _metadata(cur, n_kv)
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"{path}: {Keys.General.ALIGNMENT} {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = tuple(_place(path, cur.size, data_offset, alignment, info) for info in infos)
    _check_overlap(path, tensors)
    return GGUFFile(path, version, cur.size, alignment, data_offset, metadata, tensors)


def _metadata(cur: Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        if not key or key in metadata:  # gguf.cpp refuses both
            raise cur.fail(f"metadata key {key!r} is empty or appears twice")
        metadata[key] = cur.value(cur.u32(f"type of {key!r}"), f"value of {key!r}")
    return metadata


def _tensor_info(cur: Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
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
        raise GGUFFormatError(
            f"{path}: tensor {name!r} row length {shape[0]} is not a multiple of the {ggml_type.name} block size "
            f"{block_size}"
        )
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
