"""A bounded walk over the bytes of a GGUF header (the reader in ondevice.gguf.reader uses it).

Every length and count is checked against the bytes left in the file before it is used, and
the work a header can ask for is capped, so time and memory stay proportional to the file
with a small constant, whatever the bytes say: arrays of arrays are never built as Python
objects (they are walked and kept as ArrayRef), a count must fit in the bytes left at the
smallest size its items can have, and past the limits below the file is refused with
GGUFFormatError.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ondevice.core.errors import GGUFFormatError

__all__ = ["ArrayRef", "Cursor", "not_regular_reason", "MAX_NESTING", "MAX_NESTED_ARRAYS", "MAX_ARRAY_STRINGS"]

MAX_NESTING = 4  # array depth: a metadata array is depth 1, an array inside it 2 (llama.cpp reads none)
MAX_NESTED_ARRAYS = 1 << 16  # arrays inside arrays, whole header
MAX_ARRAY_STRINGS = 1 << 22  # strings inside arrays, whole header (a 262k vocabulary and its merges: < 1M)
MAX_ARRAY_ITEMS = 1 << 30  # items in one array (gguf.cpp: GGUF_MAX_ARRAY_ELEMENTS)
MAX_STRING_BYTES = 1 << 30  # bytes in one string (gguf.cpp: GGUF_MAX_STRING_LENGTH)
SMALL_ARRAY = 64  # arrays of scalars or strings up to this many items are decoded up front

_SCALAR_DTYPES = {vt: np.dtype(t).newbyteorder("<") for vt, t in GGUFReader.gguf_scalar_to_np.items()}
_U64 = struct.Struct("<Q")
# smallest bytes an array item can take: a string is its u64 length at least; an inner array
# its u32 item type and u64 count
_MIN_ITEM_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12} | {
    vt: dt.itemsize for vt, dt in _SCALAR_DTYPES.items()
}


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array left undecoded: large ones, and every array of arrays."""

    item_type: GGUFValueType  # element type
    count: int  # number of elements
    offset: int  # byte offset of the first element in the file
    nbytes: int  # bytes the elements occupy in the header
    depth: int = 1  # nesting level: 1 for a metadata value, 2 for an array inside one, ...

    def __len__(self) -> int:
        return self.count


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular_reason(mode: int) -> str | None:
    """Why a file of this st_mode cannot be read as a GGUF file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return f"not a regular file ({kind}); give the path of a .gguf file on disk"


class Cursor:
    """A position in a GGUF file's bytes (memory-mapped), with the header's work budget."""

    def __init__(self, path: Path, buf: Any, size: int, closer: Callable[[], None], text_errors: str = "replace"):
        self.path, self.buf, self.size, self.pos, self._closer = path, buf, size, 0, closer
        self.text_errors = text_errors  # how invalid UTF-8 in strings is decoded
        self.nested_left = MAX_NESTED_ARRAYS  # arrays inside arrays the rest of the header may hold
        self.strings_left = MAX_ARRAY_STRINGS  # strings inside arrays the rest of the header may hold

    @classmethod
    def open(cls, path: Path, text_errors: str = "replace") -> Cursor:
        """Map `path` for reading. Non-blocking open: a FIFO swapped in after the caller's check
        is refused here instead of waiting for a writer."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        try:
            st = os.fstat(fd)
            reason = not_regular_reason(st.st_mode)
            if reason:
                raise GGUFFormatError(f"{path}: {reason}")
            if st.st_size == 0:
                return cls(path, b"", 0, lambda: None, text_errors)
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the map holds its own reference
        return cls(path, mm, st.st_size, mm.close, text_errors)

    def __enter__(self) -> Cursor:
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
        if n > MAX_STRING_BYTES:
            raise self.fail(f"{what}: a string of {n} bytes (at most {MAX_STRING_BYTES})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors=self.text_errors)

    def value_type(self, raw: int, what: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {raw}") from None

    def value(self, raw_type: int, what: str) -> Any:
        """One metadata value: a scalar, a str, a list (small arrays) or an ArrayRef."""
        vt = self.value_type(raw_type, what)
        if vt == GGUFValueType.STRING:
            return self.string(what)
        if vt == GGUFValueType.ARRAY:
            item_type = self.value_type(self.u32(f"{what} item type"), what)
            return self.array(item_type, self.u64(f"{what} count"), what, depth=1)
        dtype = _SCALAR_DTYPES[vt]
        self.need(dtype.itemsize, what)
        value = np.frombuffer(self.buf, dtype=dtype, count=1, offset=self.pos)[0].item()
        self.pos += dtype.itemsize
        return value

    def array(self, item_type: GGUFValueType, count: int, what: str, depth: int) -> Any:
        """The items of a small array of scalars or strings (a list); else an ArrayRef, walked past."""
        start = self.pos
        self.admit(item_type, count, what, depth)
        if count <= SMALL_ARRAY and item_type != GGUFValueType.ARRAY:
            items = self.items(item_type, count, depth)
            return items.tolist() if isinstance(items, np.ndarray) else items
        self.skip(item_type, count, what, depth)
        return ArrayRef(item_type=item_type, count=count, offset=start, nbytes=self.pos - start, depth=depth)

    def admit(self, item_type: GGUFValueType, count: int, what: str, depth: int) -> None:
        """Refuse an array the file cannot hold or the header's budget does not allow."""
        if depth > MAX_NESTING:
            raise self.fail(f"{what}: arrays nested too deep (more than {MAX_NESTING} levels)")
        if count > MAX_ARRAY_ITEMS:
            raise self.fail(f"{what}: an array of {count} items (at most {MAX_ARRAY_ITEMS})")
        left = self.size - self.pos
        if count * _MIN_ITEM_BYTES[item_type] > left:
            raise self.fail(f"{what}: an array of {count} {item_type.name} items cannot fit in the {left} bytes left")
        if item_type == GGUFValueType.ARRAY:
            if count > self.nested_left:
                raise self.fail(f"{what}: more than {MAX_NESTED_ARRAYS} nested arrays in the header")
            self.nested_left -= count
        elif item_type == GGUFValueType.STRING:
            if count > self.strings_left:
                raise self.fail(f"{what}: more than {MAX_ARRAY_STRINGS} strings in arrays in the header")
            self.strings_left -= count

    def skip(self, item_type: GGUFValueType, count: int, what: str, depth: int) -> None:
        """Walk past `count` admitted items without building them."""
        if item_type == GGUFValueType.ARRAY:
            for _ in range(count):
                inner = self.value_type(self.u32(f"{what} item type"), what)
                n = self.u64(f"{what} count")
                self.admit(inner, n, what, depth + 1)
                self.skip(inner, n, what, depth + 1)
        elif item_type == GGUFValueType.STRING:
            self._skip_strings(count, what)
        else:
            nbytes = _SCALAR_DTYPES[item_type].itemsize * count
            self.need(nbytes, f"{what} data")
            self.pos += nbytes

    def _skip_strings(self, count: int, what: str) -> None:
        self._strings(count, what, None)

    def strings(self, count: int) -> list[str]:
        """Decode `count` admitted strings (an array's items) as a list of str."""
        out: list[str] = []
        self._strings(count, "array string", out)
        return out

    def _strings(self, count: int, what: str, out: list[str] | None) -> None:
        """Walk `count` admitted strings, appending each (decoded) to `out` unless it is None."""
        buf, pos, size, unpack, errors = self.buf, self.pos, self.size, _U64.unpack_from, self.text_errors
        keep = out.append if out is not None else None
        for _ in range(count):  # the hot loop of a large vocabulary: locals only
            if pos + 8 > size:
                break
            n = unpack(buf, pos)[0]
            if n > MAX_STRING_BYTES or pos + 8 + n > size:
                break
            pos += 8 + n
            if keep is not None:
                keep(str(buf[pos - n : pos], "utf-8", errors))
        else:
            self.pos = pos
            return
        self.pos = pos
        raise self.fail(f"truncated or corrupt header: a string in {what} runs past the end of the file")

    def items(self, item_type: GGUFValueType, count: int, depth: int) -> list[Any] | np.ndarray:
        """Decode `count` admitted items: numbers as a numpy array, strings as a list of str,
        arrays as a list of their values (lists or ArrayRefs, as `array` gives them)."""
        if item_type == GGUFValueType.STRING:
            return self.strings(count)
        if item_type == GGUFValueType.ARRAY:
            out = []
            for _ in range(count):
                inner = self.value_type(self.u32("nested array item type"), "nested array")
                out.append(self.array(inner, self.u64("nested array count"), "nested array", depth + 1))
            return out
        dtype = _SCALAR_DTYPES[item_type]
        self.need(dtype.itemsize * count, "array data")
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += dtype.itemsize * count
        return arr.astype(bool) if item_type == GGUFValueType.BOOL else arr
