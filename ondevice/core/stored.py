"""Reading a stored file without trusting it: regular files only, a size bound, a bounded parse.

Every file the product reads back (results, caches, verdicts, the registry, a text file named on
the command line) may be a FIFO (opening it would block forever), a link to /dev/zero (reading
it would never end), a huge file, or JSON/TOML nested deep enough to exhaust the recursion
limit. `read_regular_file` opens with O_NONBLOCK (a FIFO never blocks), refuses anything but a
regular file and reads at most `max_bytes`; `load_json` / `load_toml` add a nesting bound and
refuse the non-finite JSON constants (NaN, Infinity). Errors are `StoredFileError`, one line
naming the file; FileNotFoundError passes through so callers can tell "absent" from "damaged".
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from ondevice.core.errors import OndeviceError

__all__ = ["MAX_NESTING", "StoredFileError", "load_json", "load_toml", "parse_json", "read_regular_file"]

MAX_NESTING = 64  # deeper than any file the product writes, far below Python's recursion limit


class StoredFileError(OndeviceError):
    """A stored file that cannot be used: not a regular file, too large, unreadable or malformed."""


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (links followed), at most `max_bytes` of them.

    Raises FileNotFoundError when absent, StoredFileError for a directory, device, FIFO or
    socket, a file over `max_bytes`, or an error while reading."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoredFileError(f"{path}: cannot open ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StoredFileError(f"{path}: not a regular file ({_kind(mode)})")
        data = _read_at_most(fd, max_bytes + 1)
    except OSError as exc:
        raise StoredFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise StoredFileError(f"{path}: larger than {max_bytes} bytes; not a file this program wrote")
    return data


def load_json(path: str | Path, max_bytes: int, max_nesting: int = MAX_NESTING) -> Any:
    """Parsed JSON from the regular file at `path`; StoredFileError for non-UTF-8, malformed JSON,
    NaN/Infinity constants or nesting deeper than `max_nesting`."""
    return parse_json(_decode(path, read_regular_file(path, max_bytes)), path, max_nesting)


def parse_json(text: str, where: str | Path, max_nesting: int = MAX_NESTING) -> Any:
    """Parsed JSON from stored text (a file's, or a database column's); StoredFileError naming `where`
    for malformed JSON, NaN/Infinity constants, a number too large for a float (1e999) or nesting
    deeper than `max_nesting`."""
    _check_nesting(where, text, max_nesting)
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError as exc:
        raise StoredFileError(f"{where}: not JSON ({_short(exc)})") from None


def load_toml(path: str | Path, max_bytes: int, max_nesting: int = MAX_NESTING) -> dict[str, Any]:
    """Parsed TOML from the regular file at `path`; StoredFileError for non-UTF-8, malformed TOML
    or nesting deeper than `max_nesting`."""
    text = _decode(path, read_regular_file(path, max_bytes))
    _check_nesting(path, text, max_nesting)
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise StoredFileError(f"{path}: not valid TOML ({_short(exc)})") from None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _decode(path: str | Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoredFileError(f"{path}: not UTF-8 text") from None


def _check_nesting(path: str | Path, text: str, max_nesting: int) -> None:
    """Bracket depth outside strings, a bound checked before the recursive parser runs. Brackets
    inside strings are skipped, so a file this program wrote is never refused."""
    depth, in_string, escaped = 0, None, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == in_string:
                in_string = None
        elif ch in "\"'":
            in_string = ch
        elif ch in "[{":
            depth += 1
            if depth > max_nesting:
                raise StoredFileError(f"{path}: nested deeper than {max_nesting} levels")
        elif ch in "]}":
            depth -= 1


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a float's range")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "a device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
