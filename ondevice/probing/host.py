"""Host probes: memory bandwidth (read, copy) with threads, f32 matmul GFLOP/s, and the
disk's sequential read of a file that is not in the page cache.

Bandwidth is counted as STREAM counts it: read = bytes read, copy = 2 x bytes (read + write).
Each pass runs one slice per thread (numpy releases the GIL in its loops, ctypes in its calls; the
threads start together at a barrier); the figure is the best of several passes, over arrays at
least 4x the last-level cache, filled first so no page is the shared zero page. The read pass is
libc's memchr where the C library is one that vectorizes it (glibc, macOS), else numpy's sum
(read_kernel_name; MemoryProbe.read_kernel says which measured).

No triad: numpy has no fused a = b + s*c, so a triad is either two passes over memory (5 arrays'
worth of traffic, not the 3 STREAM counts) or a loop over cache-sized blocks through a temporary,
which times numpy's per-block call overhead with the memory, and that overhead depends on the
machine (benchmarks/README.md has the figures). Decode reads weights; the ceiling is the best of
read and copy (ProbeResult.ceiling_gbs), so the triad is not measured.

The disk read (probe_disk) is what a cold start pays before the weights are in memory: a
temporary file written in the cache dir (the file system the default model lives on), dropped
from the page cache (ondevice.core.pagecache; macOS: F_NOCACHE), then read in order in 8 MiB
chunks, best of two passes. Where the page cache cannot be bypassed, or kept the file anyway
(tmpfs), there is no figure (read_gbs None) rather than the page cache's speed.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ondevice.core.errors import ProbeError

__all__ = [
    "QUICK_MIN_ARRAY_BYTES",
    "MemoryProbe",
    "ComputeProbe",
    "DiskProbe",
    "MemoryPasses",
    "probe_memory",
    "probe_compute",
    "probe_disk",
    "array_bytes_for",
    "best_of",
    "read_words",
    "read_kernel_name",
]

_MB = 1 << 20
_MIN_SLICE = 32 * 1024  # float64 elements per thread at least
MIN_ARRAY_BYTES = 256 * _MB  # also covers system-level caches the OS does not report
# the first-contact probe's floor: half of it. Its arrays are fresh memory, and touching fresh memory is most of what
# a first run adds (slow on some VMs: a page fault each that the host backs); still 4x the caches the OS reports,
# and a full `ondevice probe` measures over MIN_ARRAY_BYTES later
QUICK_MIN_ARRAY_BYTES = 128 * _MB
_ABSENT_BYTE = 0x01  # memchr's needle: the arrays hold 1.0 and 2.0 (bytes 0x00, 0xF0, 0x3F and 0x40), never this


@dataclass(frozen=True)
class MemoryProbe:
    read_gbs: float  # read-only bandwidth, GB/s (1e9 bytes/s)
    copy_gbs: float  # copy bandwidth (read + write counted), GB/s
    n_threads: int  # threads, one slice each
    array_bytes: int  # bytes of each array
    passes: int  # passes per kernel; the best is kept
    elapsed_s: float  # wall time of the whole probe, seconds
    read_kernel: str = "numpy-sum"  # what read: "memchr" (libc's) or "numpy-sum" (read_words); caches before it: numpy

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ComputeProbe:
    f32_gflops: float  # achievable f32 GFLOP/s of an n x n matrix product (numpy's BLAS)
    matrix_n: int  # matrix side
    elapsed_s: float  # wall time of the probe, seconds

    def to_dict(self) -> dict:
        return asdict(self)


def array_bytes_for(
    llc_bytes: int | None, available_bytes: int | None, n_arrays: int = 2, *, floor: int = MIN_ARRAY_BYTES
) -> int:
    """Bytes per array: at least 4x the last-level cache and `floor`, the n_arrays together at most 1/8
    of the free RAM, never below 8 MiB; whole MiB."""
    want = max(4 * (llc_bytes or 0), floor)
    if available_bytes:
        want = min(want, available_bytes // (8 * n_arrays))
    return max(want // _MB, 8) * _MB


def probe_memory(n_threads: int, array_bytes: int, passes: int = 5) -> MemoryProbe:
    """Read and copy bandwidth with `n_threads` threads over two arrays of `array_bytes`."""
    if n_threads < 1 or passes < 1:
        raise ProbeError("memory probe: n_threads and passes must be at least 1")
    t_start = time.perf_counter()
    with MemoryPasses(n_threads, array_bytes) as arrays:
        read_s, copy_s = arrays.read_s(passes), arrays.copy_s(passes)
    return MemoryProbe(
        read_gbs=arrays.array_bytes / read_s / 1e9,
        copy_gbs=2 * arrays.array_bytes / copy_s / 1e9,
        n_threads=n_threads,
        array_bytes=arrays.array_bytes,
        passes=passes,
        elapsed_s=time.perf_counter() - t_start,
        read_kernel=arrays.read_kernel,
    )


class MemoryPasses:
    """The memory probe's two arrays, filled, and its threads (one slice each): timed read and copy
    passes, as many at a time as asked for (benchmarks/host_accuracy.py takes them one at a time,
    each between two passes of a C kernel). A context manager; close() stops the threads and frees the arrays."""

    def __init__(self, n_threads: int, array_bytes: int):
        n = max(-(-(array_bytes // 8) // n_threads), _MIN_SLICE) * n_threads  # >= array_bytes, whole slices
        try:
            self._a, self._b = np.empty(n), np.empty(n)  # float64 [n] each
        except MemoryError as exc:
            raise ProbeError(f"memory probe: cannot allocate 2 x {n * 8} bytes") from exc
        self.array_bytes = n * 8  # bytes of each array
        self._bounds = _slices(n, n_threads)  # [(start, end)] element index per thread
        memchr = _libc_memchr()
        self.read_kernel = "numpy-sum" if memchr is None else "memchr"  # what read_s reads with
        # (lo, hi) -> None: read elements lo..hi of the read array (close() stops the pool before freeing it)
        self._read_slice = (
            (lambda lo, hi: read_words(self._a[lo:hi]))
            if memchr is None
            else functools.partial(_scan, memchr, self._a.ctypes.data)
        )
        self._pool = ThreadPoolExecutor(n_threads, thread_name_prefix="ondevice-probe")
        a, b = self._a, self._b

        def fill(span: tuple[int, int]) -> None:
            a[span[0] : span[1]] = 1.0
            b[span[0] : span[1]] = 2.0

        # the threads fault the pages in together, as STREAM's initialisation does (most of a first
        # probe is this fill, and threads share it)
        try:
            list(self._pool.map(fill, self._bounds))
        except BaseException:
            self.close()
            raise

    def read_s(self, passes: int = 1) -> float:
        """Seconds of the fastest of `passes` passes reading one array (read_kernel)."""
        return _best(self._pool, self._bounds, passes, self._read_slice)

    def copy_s(self, passes: int = 1) -> float:
        """Seconds of the fastest of `passes` passes copying one array into the other."""
        return _best(self._pool, self._bounds, passes, lambda lo, hi: np.copyto(self._b[lo:hi], self._a[lo:hi]))

    def close(self) -> None:
        """Stop the threads and let the arrays go (the memory is back as soon as this returns)."""
        self._pool.shutdown()
        self._a = self._b = np.empty(0)

    def __enter__(self) -> MemoryPasses:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def best_of(a: MemoryProbe, b: MemoryProbe) -> MemoryProbe:
    """Two MemoryProbes of the same machine -> the best figure of each kernel (passes added up)."""
    return replace(
        a,
        read_gbs=max(a.read_gbs, b.read_gbs),
        copy_gbs=max(a.copy_gbs, b.copy_gbs),
        passes=a.passes + b.passes,
        read_kernel=(a if a.read_gbs >= b.read_gbs else b).read_kernel,
        elapsed_s=a.elapsed_s + b.elapsed_s,
    )


def _slices(n: int, k: int) -> list[tuple[int, int]]:
    step = -(-n // k)
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def read_words(view: np.ndarray) -> int:
    """Read every byte of a contiguous array once (the read-bandwidth kernel): a wrapping integer sum
    of its 64-bit words. A max falls behind a DRAM read (numpy's float max checks for NaN and is
    compute-bound; AVX2 and NEON have no 64-bit integer max), while a 64-bit add is one instruction
    on both (benchmarks/README.md: the kernels against a C read kernel)."""
    return int(view.view(np.uint64).sum())


def _scan(memchr, base: int, lo: int, hi: int) -> None:
    """Read float64 elements lo..hi of the array at address `base` with memchr, looking for a byte they never hold."""
    if memchr(base + 8 * lo, _ABSENT_BYTE, 8 * (hi - lo)) is not None:  # it stopped early: not a whole pass
        raise ProbeError("memory probe: the read pass found a byte its arrays never hold")


def read_kernel_name() -> str:
    """The memory probe's read kernel here: "memchr" or "numpy-sum"."""
    return "numpy-sum" if _libc_memchr() is None else "memchr"


@functools.lru_cache(maxsize=1)
def _libc_memchr():
    """libc's memchr through ctypes (which lets the GIL go for the call) where the C library is one that
    vectorizes it for long scans (glibc: SSE2/AVX2/EVEX on x86-64, ASIMD on arm64; macOS), else None.

    A scan for a byte the array does not hold reads every byte once, as a C read kernel does; numpy's
    sum falls a little behind one (benchmarks/host_accuracy.py measures both against C). Elsewhere
    (musl's, Windows' C runtime) its speed is not known, and numpy's sum reads."""
    if sys.platform != "darwin":
        try:
            if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
                return None
        except (AttributeError, ValueError, OSError, TypeError):  # no confstr (Windows), no such name (musl)
            return None
    try:
        import ctypes  # an optional module of CPython

        memchr = ctypes.CDLL(None).memchr
    except (ImportError, OSError, AttributeError, TypeError):
        return None
    memchr.restype, memchr.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return memchr


def _best(pool: ThreadPoolExecutor, bounds, passes: int, kernel: Callable[[int, int], object]) -> float:
    """Fastest of `passes` passes; a pass runs from the first thread's start to the last one's end.

    The threads meet at a barrier and each times its own slice, so the time spent handing the
    jobs to the pool (and waiting for the GIL to start them) is not counted: an OpenMP loop's
    threads start together too.
    """
    best = float("inf")
    for _ in range(passes):
        barrier = threading.Barrier(len(bounds), timeout=60)  # the pool has a worker per slice

        def timed(lo: int, hi: int) -> tuple[float, float]:
            barrier.wait()
            start = time.perf_counter()
            kernel(lo, hi)
            return start, time.perf_counter()

        spans = [f.result() for f in [pool.submit(timed, lo, hi) for lo, hi in bounds]]
        best = min(best, max(end for _, end in spans) - min(start for start, _ in spans))
    return best


def probe_compute(budget_s: float = 0.6, max_n: int = 2048) -> ComputeProbe:
    """Best f32 GFLOP/s of an n x n matmul, n doubled from 256 while a product takes < budget/8."""
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    n, best_rate, best_n = 256, 0.0, 256
    while True:
        x = rng.standard_normal((n, n), dtype=np.float32)
        y = rng.standard_normal((n, n), dtype=np.float32)
        out = np.empty((n, n), dtype=np.float32)
        took = _best_matmul(x, y, out, repeats=3)
        rate = 2.0 * n**3 / took / 1e9
        if rate > best_rate:
            best_rate, best_n = rate, n
        if n >= max_n or took > budget_s / 8 or time.perf_counter() - t_start > budget_s:
            break
        n *= 2
    return ComputeProbe(f32_gflops=best_rate, matrix_n=best_n, elapsed_s=time.perf_counter() - t_start)


def _best_matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(x, y, out=out)
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass(frozen=True)
class DiskProbe:
    """Sequential read of a file that is not in the page cache (module docstring)."""

    read_gbs: float | None  # best pass, GB/s (1e9 bytes/s); None: the page cache could not be bypassed (see note)
    file_bytes: int  # size of the temporary file read, bytes
    folder: str  # where it was written (the cache dir's probe folder)
    device: int | None  # st_dev of that folder: a model file on another device is read from another disk
    method: str  # how the page cache was bypassed: "posix_fadvise(POSIX_FADV_DONTNEED)", "F_NOCACHE" or "none"
    resident_at_read: float | None  # share of the file in the page cache when a pass began, 0..1 (None: unknown)
    passes: int  # read passes timed
    elapsed_s: float  # wall time of the probe (writing the file included), seconds
    note: str = ""  # why there is no figure, or what to know about it

    def to_dict(self) -> dict:
        return asdict(self)


_DISK_CHUNK = 8 * _MB  # bytes per write/read call
_DISK_SYNC_EVERY = 4  # chunks between fsyncs while writing (32 MiB): the write phase stays within its budget


def probe_disk(
    folder: str | Path, *, budget_s: float = 1.5, max_bytes: int = 512 * _MB, min_bytes: int = 32 * _MB, passes: int = 2
) -> DiskProbe:
    """Sequential read bandwidth of `folder`'s file system, page cache bypassed (module docstring).

    Writes at most max_bytes (less on a slow disk: the writing stops at 40% of budget_s, or
    with little free space), reads it `passes` times (dropping it from the page cache before
    each; a pass that would overrun the budget is skipped), removes it. Raises ProbeError
    when the folder cannot be written or has too little free space.
    """
    from ondevice.core import paths

    if passes < 1 or max_bytes < min_bytes or budget_s <= 0:
        raise ProbeError("disk probe: passes, sizes and budget must be positive (max_bytes >= min_bytes)")
    t_start = time.perf_counter()
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        device = os.stat(folder).st_dev
    except OSError as exc:
        raise ProbeError(f"disk probe: cannot use {folder}: {exc.strerror or exc}") from None
    cap = min(max_bytes, free // 4) // _DISK_CHUNK * _DISK_CHUNK
    if cap < min_bytes:
        raise ProbeError(
            f"disk probe: {folder} has {free >> 20} MiB free, too little for a {min_bytes >> 20} MiB test file"
        )
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".disk-probe{paths.TEMP_TAG}{os.getpid()}-")
    path = Path(name)
    try:
        method = _no_cache(fd)
        size = _write(fd, cap, min_bytes, 0.4 * budget_s)
        os.close(fd)
        fd = -1
        best, resident, done, note = None, None, 0, ""
        for _ in range(passes):
            if done and time.perf_counter() - t_start + (size / best / 1e9 if best else 0) > budget_s:
                break
            took, resident, method, note = _read_cold(path, size, method)
            if took is None:
                break
            done += 1
            best = size / took / 1e9 if best is None else max(best, size / took / 1e9)
        return DiskProbe(
            read_gbs=best,
            file_bytes=size,
            folder=str(folder),
            device=device,
            method=method,
            resident_at_read=resident,
            passes=done,
            elapsed_s=time.perf_counter() - t_start,
            note=note,
        )
    except OSError as exc:
        raise ProbeError(f"disk probe in {folder}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        path.unlink(missing_ok=True)


def _no_cache(fd: int) -> str:
    """Ask the OS not to cache fd's pages where only that works (macOS); the method used."""
    if sys.platform.startswith("linux"):
        return "posix_fadvise(POSIX_FADV_DONTNEED)"
    if sys.platform == "darwin":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_NOCACHE, 1)
            return "F_NOCACHE"
        except (OSError, AttributeError):
            return "none"
    return "none"


def _write(fd: int, cap: int, min_bytes: int, budget_s: float) -> int:
    """Fill the file with incompressible bytes, synced to the disk, up to cap or budget_s; the size."""
    chunk = os.urandom(_DISK_CHUNK)
    start, size, n = time.perf_counter(), 0, 0
    while size < cap:
        size += os.write(fd, chunk)
        n += 1
        if n % _DISK_SYNC_EVERY == 0:
            os.fsync(fd)
            if size >= min_bytes and time.perf_counter() - start > budget_s:
                break
    os.fsync(fd)
    return size


def _read_cold(path: Path, size: int, method: str) -> tuple[float | None, float | None, str, str]:
    """One timed sequential read of `path` after dropping it from the page cache:
    (seconds or None when it could not be dropped, resident share at the start, method, note)."""
    from ondevice.core.pagecache import evict_page_cache

    resident = None
    if method != "F_NOCACHE":
        ev = evict_page_cache(path)
        if not ev.evicted:
            return (
                None,
                ev.resident_after,
                "none",
                f"the page cache cannot be bypassed here ({ev.note}): no disk figure",
            )
        resident = ev.resident_after
        if resident is not None and resident > 0.05:
            return (
                None,
                resident,
                ev.method,
                (
                    f"{100 * resident:.0f}% of the test file stayed in the page cache "
                    "(a RAM-backed file system?): no disk figure"
                ),
            )
    buf = bytearray(_DISK_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        if method == "F_NOCACHE":
            import fcntl

            fcntl.fcntl(f.fileno(), getattr(fcntl, "F_NOCACHE"), 1)  # noqa: B009 - macOS only: not in Linux's fcntl
        elif hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)  # as llama.cpp's loader asks
        start, got = time.perf_counter(), 0
        while got < size:
            n = f.readinto(view)
            if not n:
                break
            got += n
        took = time.perf_counter() - start
    if got < size:
        raise OSError(f"read {got} of {size} bytes")
    return took, resident, method, ""
