"""sha256 of file contents: the one reader behind model verification, bench records and assembly."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["sha256_file", "copy_sha256", "CHUNK_BYTES"]

CHUNK_BYTES = 4 << 20  # read block: large enough to run at disk speed, small enough to stay out of the way


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    for block in _blocks(path):
        digest.update(block)
    return digest.hexdigest()


def copy_sha256(
    sources: Iterable[str | Path], out: IO[bytes], progress: Callable[[int, int], None] | None = None
) -> str:
    """Write the files `sources`, one after another, to `out`; the hex sha256 of all that was written.
    progress(bytes written, bytes in all) hears each block."""
    sources = list(sources)
    total = sum(os.stat(s).st_size for s in sources) if progress is not None else 0
    digest = hashlib.sha256()
    done = 0
    for source in sources:
        for block in _blocks(source):
            digest.update(block)
            out.write(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


def _blocks(path: str | Path) -> Iterator[bytes]:
    with open(path, "rb") as src:
        while block := src.read(CHUNK_BYTES):
            yield block
