"""Read bandwidth over working-set sizes: how much faster than DRAM the caches serve a model.

A decode step reads the same bytes (weights, then the KV cache) every token. When they fit in
the last-level cache, or in what share of it a VM's slice gets, they come back faster than from
DRAM; the size the OS reports is no guide in a VM. So the probe measures it: numpy's sum
(host.read_words) over arrays from 2 MiB growing by sqrt(2) up to the DRAM size the memory probe
uses. roofline.read_speedup interpolates it: the bound of a model that small is scaled by it (the
curve against itself, each size over its DRAM size, so one kernel reads every size).
"""

from __future__ import annotations

import numpy as np

from ondevice.probing.host import _best, _slices, read_words

__all__ = ["probe_read_curve", "curve_sizes", "monotone", "best_curve"]

_MB = 1 << 20
_MIN_TIMED_BYTES = 64 * _MB  # each timed pass reads at least this much per thread (small arrays: repeated)


def curve_sizes(dram_bytes: int, smallest: int = 2 * _MB) -> list[int]:
    """Working-set sizes from `smallest` growing by sqrt(2) (whole 64 KiB) while below dram_bytes, then
    dram_bytes itself. A cache's edge is a cliff, not a slope (a working set read in a cycle just past
    a least-recently-used cache gets no hits), so the sizes are close enough that interpolating
    between two of them cannot lend a model much of a speed-up it does not get."""
    sizes, k = [], 0
    while (size := int(smallest * 2 ** (k / 2)) // _GRAIN * _GRAIN) < dram_bytes:
        sizes.append(size)
        k += 1
    return sizes + [dram_bytes]


_GRAIN = 64 * 1024  # curve sizes are whole multiples of this


def probe_read_curve(n_threads: int, dram_bytes: int, passes: int = 3) -> tuple[tuple[int, float], ...]:
    """(bytes, read GB/s) for each of curve_sizes(dram_bytes), `n_threads` threads, best of `passes`.
    One array of dram_bytes is filled once; each size reads its first `size` bytes, every thread its
    slice, repeated until a pass reads enough to time."""
    from concurrent.futures import ThreadPoolExecutor

    n_total = max(dram_bytes // 8, n_threads)
    a = np.ones(n_total)
    out = []
    with ThreadPoolExecutor(n_threads, thread_name_prefix="ondevice-curve") as pool:
        for size in curve_sizes(n_total * 8):
            n = max(size // 8 // n_threads, 1) * n_threads
            repeat = max(1, _MIN_TIMED_BYTES // max(1, size // n_threads))

            def read(lo: int, hi: int, repeat: int = repeat) -> None:
                view = a[lo:hi]
                for _ in range(repeat):
                    read_words(view)

            seconds = _best(pool, _slices(n, n_threads), passes, read)
            out.append((n * 8, n * 8 * repeat / seconds / 1e9))
    return monotone(out)


def monotone(curve) -> tuple[tuple[int, float], ...]:
    """A smaller working set is never read slower than a larger one (a slower figure is noise):
    each point's bandwidth at least that of every larger size."""
    out, floor = [], 0.0
    for size, gbs in sorted(curve, reverse=True):
        floor = max(floor, gbs)
        out.append((size, floor))
    return tuple(sorted(out))


def best_curve(a, b) -> tuple[tuple[int, float], ...]:
    """Two curves of the same sizes -> the best figure of each size."""
    if not a or not b:
        return tuple(a or b)
    return monotone([(s, max(g, h)) for (s, g), (_s, h) in zip(sorted(a), sorted(b))])
