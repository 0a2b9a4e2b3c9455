"""Host probes: memory bandwidth (read, copy) with threads, and f32 matmul GFLOP/s.

Bandwidth is counted as STREAM counts it: read = bytes read, copy = 2 x bytes (read + write).
Each pass runs one slice per thread (numpy releases the GIL in its loops; the threads start
together at a barrier); the figure is the best of several passes, over arrays at least 4x the
last-level cache, filled first so no page is the shared zero page.

No triad: numpy has no fused a = b + s*c, so a triad is either two passes over memory (5
arrays' worth of traffic, not the 3 STREAM counts) or a blocked loop whose Python overhead per
block is timed with it. Measured on an AMD EPYC VM, 256 MiB arrays, one thread: a C triad 36.4
GB/s, the blocked numpy one 27.3, the two-pass one 23.9 (39.8 counting what moves); the issue's
Intel VM: 16 against 28. Either way it reported a kernel's overhead as the memory's speed, and
decode reads weights: read and copy are what the roofline uses.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from ondevice.errors import ProbeError

__all__ = ["MemoryProbe", "ComputeProbe", "probe_memory", "probe_compute", "array_bytes_for", "best_of"]

_MB = 1 << 20
_MIN_SLICE = 32 * 1024  # float64 elements per thread at least
MIN_ARRAY_BYTES = 256 * _MB  # also covers system-level caches the OS does not report


@dataclass(frozen=True)
class MemoryProbe:
    read_gbs: float  # read-only bandwidth, GB/s (1e9 bytes/s)
    copy_gbs: float  # copy bandwidth (read + write counted), GB/s
    n_threads: int  # threads, one slice each
    array_bytes: int  # bytes of each array
    passes: int  # passes per kernel; the best is kept
    elapsed_s: float  # wall time of the whole probe, seconds

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ComputeProbe:
    f32_gflops: float  # achievable f32 GFLOP/s of an n x n matrix product (numpy's BLAS)
    matrix_n: int  # matrix side
    elapsed_s: float  # wall time of the probe, seconds

    def to_dict(self) -> dict:
        return asdict(self)


def array_bytes_for(llc_bytes: int | None, available_bytes: int | None, n_arrays: int = 2) -> int:
    """Bytes per array: at least 4x the last-level cache and MIN_ARRAY_BYTES, the n_arrays
    together at most 1/8 of the free RAM, never below 8 MiB; whole MiB."""
    want = max(4 * (llc_bytes or 0), MIN_ARRAY_BYTES)
    if available_bytes:
        want = min(want, available_bytes // (8 * n_arrays))
    return max(want // _MB, 8) * _MB


def probe_memory(n_threads: int, array_bytes: int, passes: int = 5) -> MemoryProbe:
    """Read and copy bandwidth with `n_threads` threads over two arrays of `array_bytes`."""
    if n_threads < 1 or passes < 1:
        raise ProbeError("memory probe: n_threads and passes must be at least 1")
    t_start = time.perf_counter()
    n = max(-(-(array_bytes // 8) // n_threads), _MIN_SLICE) * n_threads  # >= array_bytes, whole slices
    try:
        a, b = np.ones(n), np.full(n, 2.0)
    except MemoryError as exc:
        raise ProbeError(f"memory probe: cannot allocate 2 x {n * 8} bytes") from exc
    bounds = _slices(n, n_threads)
    with ThreadPoolExecutor(n_threads, thread_name_prefix="ondevice-probe") as pool:
        read_s = _best(pool, bounds, passes, lambda lo, hi: a[lo:hi].max())
        copy_s = _best(pool, bounds, passes, lambda lo, hi: np.copyto(b[lo:hi], a[lo:hi]))
    size = n * 8
    return MemoryProbe(
        read_gbs=size / read_s / 1e9,
        copy_gbs=2 * size / copy_s / 1e9,
        n_threads=n_threads,
        array_bytes=size,
        passes=passes,
        elapsed_s=time.perf_counter() - t_start,
    )


def best_of(a: MemoryProbe, b: MemoryProbe) -> MemoryProbe:
    """Two MemoryProbes of the same machine -> the best figure of each kernel (passes added up)."""
    return replace(a, read_gbs=max(a.read_gbs, b.read_gbs), copy_gbs=max(a.copy_gbs, b.copy_gbs), passes=a.passes + b.passes,
                   elapsed_s=a.elapsed_s + b.elapsed_s)


def _slices(n: int, k: int) -> list[tuple[int, int]]:
    step = -(-n // k)
    return [(i, min(i + step, n)) for i in range(0, n, step)]


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
