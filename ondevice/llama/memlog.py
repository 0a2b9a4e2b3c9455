"""The buffer sizes llama.cpp logs while it loads a model and makes a context.

llama.cpp says what it allocated, per device and purpose, in lines such as

    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    load_tensors:        CUDA0 model buffer size =  4403.49 MiB
    llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB
    llama_context:  CUDA_Host  output buffer size =     0.49 MiB
    sched_reserve:        CPU compute buffer size =   514.50 MiB

(older builds print `llama_kv_cache_unified:` or `llama_context:` before the KV and compute lines).
These are reservations: on a GPU they are device memory taken at once; on the CPU a compute
buffer is only address space until its pages are touched. The memory benchmark and the device
check read them beside what the process and the device actually hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BufferLine", "BufferLog", "parse_buffer_log", "KINDS"]

KINDS = ("model", "KV", "RS", "output", "compute")  # RS: recurrent state (Mamba-style layers)
_LINE = re.compile(
    r"(?P<device>[A-Za-z][\w-]*)\s+(?P<kind>model|KV|RS|output|compute)\s+buffer size\s*=\s*"
    r"(?P<size>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]iB|B)\b"
)
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


@dataclass(frozen=True)
class BufferLine:
    device: str  # buffer type as llama.cpp names it: "CPU", "CPU_Mapped", "CPU_REPACK", "CUDA0", "CUDA_Host", "Metal"
    kind: str  # one of KINDS
    size_bytes: int  # as logged (two decimals of MiB: within 10 KiB)


@dataclass(frozen=True)
class BufferLog:
    lines: tuple[BufferLine, ...]

    def total_bytes(self, kind: str | None = None, *, device: str | None = None) -> int:
        """Sum of the logged sizes of one kind (None: every kind) on buffers whose name starts with `device`."""
        return sum(
            b.size_bytes
            for b in self.lines
            if (kind is None or b.kind == kind) and (device is None or b.device.startswith(device))
        )

    def device_bytes(self, kind: str | None = None) -> int:
        """Sum over the accelerator's own buffers (not CPU*, not *_Host pinned host memory)."""
        return sum(
            b.size_bytes
            for b in self.lines
            if (kind is None or b.kind == kind) and not b.device.startswith("CPU") and not b.device.endswith("_Host")
        )

    def to_dict(self) -> dict:
        return {"lines": [[b.device, b.kind, b.size_bytes] for b in self.lines]}


def parse_buffer_log(text: str | Iterable[str]) -> BufferLog:
    """Every "<device> <kind> buffer size = <n> MiB" in llama.cpp's log (a string or its lines), in order."""
    lines = text.splitlines() if isinstance(text, str) else [x for chunk in text for x in chunk.splitlines()]
    out = []
    for line in lines:
        m = _LINE.search(line)
        if m:
            size = round(float(m["size"]) * _UNITS[m["unit"]])
            out.append(BufferLine(m["device"], m["kind"], size))
    return BufferLog(tuple(out))
