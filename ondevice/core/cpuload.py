"""How much CPU other processes took while this one worked: the machine's busy CPU time minus this
process's, over the wall time, in cores ("other processes used 0.9 cores during this run").

A low efficiency on a shared machine is often just that; saying it beside the figure explains it.
"""

from __future__ import annotations

import time

import psutil

__all__ = ["OtherCpu"]


def _busy_s(times) -> float:
    """Seconds a psutil cpu_times() record spent busy (everything but idle and I/O wait)."""
    return sum(v for name, v in times._asdict().items() if name not in ("idle", "iowait", "guest", "guest_nice"))


class OtherCpu:
    """Started on creation; cores() -> the CPU other processes used since, in cores (0 when unknown).
    process: this process's psutil.Process, when the caller keeps one (a meter per request then costs
    two reads of /proc, about 20 us)."""

    def __init__(self, process: psutil.Process | None = None) -> None:
        self._me = process or psutil.Process()
        self._t0 = time.perf_counter()
        self._busy0, self._mine0 = self._read()

    def _read(self) -> tuple[float, float]:
        try:
            mine = self._me.cpu_times()
            return _busy_s(psutil.cpu_times()), mine.user + mine.system
        except (psutil.Error, OSError):  # a sandbox without /proc/stat: unknown
            return 0.0, 0.0

    def cores(self) -> float:
        """Cores other processes kept busy since this meter started (never negative)."""
        busy, mine = self._read()
        wall = time.perf_counter() - self._t0
        if wall <= 0 or busy == 0.0:
            return 0.0
        return max(0.0, ((busy - self._busy0) - (mine - self._mine0)) / wall)
