"""The page cache of one file: drop it, and tell how much of it is resident.

Cold loads (the bench) and the disk read probe need a file out of the page cache. On Linux,
posix_fadvise(DONTNEED) drops its clean pages (pages another process has mapped stay);
mincore() then says how much of the file is still resident, so a cold measurement is
reported with the evidence. Elsewhere eviction is not possible without privileges and the
result says so (macOS has F_NOCACHE per open file: the disk read probe in ondevice.probing.host uses it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Eviction", "evict_page_cache", "evict_files", "resident_fraction"]


@dataclass(frozen=True)
class Eviction:
    """The outcome of trying to drop a file from the page cache."""

    evicted: bool  # the OS call succeeded
    method: str  # "posix_fadvise(POSIX_FADV_DONTNEED)" or "none"
    resident_before: float | None  # fraction of the file's pages resident before, 0..1 (None: unknown)
    resident_after: float | None  # fraction resident after, 0..1 (None: unknown)
    note: str  # a sentence for the report ("" when it all went as planned)


def evict_page_cache(path: str | Path) -> Eviction:
    """Ask the OS to drop `path` from the page cache; never raises."""
    before = resident_fraction(path)
    if not hasattr(os, "posix_fadvise") or not sys.platform.startswith("linux"):
        return Eviction(
            False,
            "none",
            before,
            before,
            f"page-cache eviction is not available on {sys.platform}; cold load not measured",
        )
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # only clean pages can be dropped: write back a freshly written file first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:
        return Eviction(
            False, "posix_fadvise(POSIX_FADV_DONTNEED)", before, before, f"page-cache eviction failed: {exc}"
        )
    after = resident_fraction(path)
    note = ""
    if after is not None and after > 0.05:
        note = (
            f"{100 * after:.0f}% of the file stayed in the page cache (mapped by another process?); "
            "the cold load is partly warm"
        )
    return Eviction(True, "posix_fadvise(POSIX_FADV_DONTNEED)", before, after, note)


def evict_files(paths: Sequence[str | Path]) -> Eviction:
    """evict_page_cache for each file of a model (a split model has several): evicted when every one was, the
    resident fractions weighted by the files' sizes, the notes of each; never raises."""
    each = [(evict_page_cache(p), _size(p)) for p in paths]
    total = sum(size for _ev, size in each)

    def weighted(fractions: list[float | None]) -> float | None:
        known = [f for f in fractions if f is not None]
        if len(known) < len(fractions):
            return None
        return sum(f * size for f, (_ev, size) in zip(known, each)) / total if total else 0.0

    notes = [ev.note for ev, _size in each if ev.note]
    return Eviction(
        all(ev.evicted for ev, _size in each),
        each[0][0].method if each else "none",
        weighted([ev.resident_before for ev, _size in each]),
        weighted([ev.resident_after for ev, _size in each]),
        "; ".join(dict.fromkeys(notes)),
    )


def _size(path: str | Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: str | Path) -> float | None:
    """Share of `path`'s pages in the page cache (mincore); None where it cannot be told."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        size = os.path.getsize(path)
        if size == 0:
            return 0.0
        libc = _libc()
        if libc is None:
            return None
        page = os.sysconf("SC_PAGE_SIZE")
        n_pages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * n_pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                resident = sum(b & 1 for b in bytes(vec))
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        return resident / n_pages
    except (OSError, AttributeError, ValueError):
        return None
