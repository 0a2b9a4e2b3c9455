"""What the OS lets a benchmark see: the peak RSS of each run. (Page-cache eviction and
residency, shared with the disk read probe, live in ondevice.core.pagecache.)
"""

from __future__ import annotations

import os
import sys

__all__ = ["PeakRss"]


class PeakRss:
    """Peak resident set size of this process over a span of work.

    On Linux the kernel's high-water mark (VmHWM) is reset by writing 5 to
    /proc/self/clear_refs, so each run's peak is its own; elsewhere the peak is the larger of
    psutil's RSS at the end and the process lifetime peak (getrusage), said in `method`.
    """

    def __init__(self) -> None:
        self.method = "VmHWM (reset per run)" if self._can_reset() else "process peak (getrusage)"

    @staticmethod
    def _can_reset() -> bool:
        return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)

    def reset(self) -> None:
        if not self._can_reset():
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.method = "process peak (getrusage)"

    def read_bytes(self) -> int | None:
        if sys.platform.startswith("linux"):
            try:
                with open("/proc/self/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            return int(line.split()[1]) * 1024
            except (OSError, ValueError, IndexError):
                pass
        try:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return int(peak if sys.platform == "darwin" else peak * 1024)
        except (ImportError, OSError):
            return None
