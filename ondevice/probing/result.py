"""What a probe measured, as frozen data that round-trips through JSON (the cache)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from ondevice.probing.hardware import GPUInfo, HostInfo, LlamaDevice
from ondevice.probing.host import ComputeProbe, DiskProbe, MemoryProbe
from ondevice.probing.nameplate import Nameplate, compute_lookup
from ondevice.roofline import Calibration

__all__ = ["ProbeResult", "SCHEMA_VERSION"]

SCHEMA_VERSION = 6  # 6: the host alone (the model's own speed is timed per model shape: probing.timing)


@dataclass(frozen=True)
class ProbeResult:
    """One machine + backend + llama.cpp build, measured."""

    host: HostInfo  # what was detected
    backend: str  # backend these results are for
    build_id: str  # llama.cpp build fingerprint (version + system info hash)
    created_unix_s: float  # when the probe ran, seconds since the epoch
    memory: MemoryProbe  # host memory bandwidth
    compute: ComputeProbe | None  # host f32 GFLOP/s (None: the first-contact probe, memory only)
    nameplate: Nameplate | None = None  # maker's figure for the chip, when known (not measured)
    read_curve: tuple[tuple[int, float], ...] = ()  # (working-set bytes, host read GB/s), 2 MiB up to the memory
    # probe's array size: what the caches add (probing.readcurve; `ondevice probe` measures it, first contact not)
    disk: DiskProbe | None = (
        None  # sequential read of the cache dir's disk (None: not measured, or a cache from before it)
    )
    from_cache: bool = field(default=False, compare=False)  # loaded from the cache rather than run now

    @property
    def age_s(self) -> float:
        """Seconds since the probe ran."""
        return max(0.0, time.time() - self.created_unix_s)

    @property
    def is_full(self) -> bool:
        """Measured by `ondevice probe` (compute, caches, disk), not only the first-contact bandwidth."""
        return self.compute is not None

    @property
    def ceiling_gbs(self) -> float:
        """The bandwidth of the roofline bound, GB/s: the best host figure measured (read, copy, the read
        curve's DRAM-sized read: a shared machine's bandwidth moves from one minute to the next). On a GPU
        backend the nameplate figure (a physical bound of the device memory) when known and higher."""
        best = max([self.memory.read_gbs, self.memory.copy_gbs] + [g for _b, g in self.read_curve[-1:]])
        if self.backend.upper() != "CPU" and self.nameplate:
            best = max(best, self.nameplate.bandwidth_gbs)
        return best

    @property
    def device_fp16_tflops(self) -> float | None:
        """The offload device's nameplate peak FP16 TFLOPS on a GPU backend (TTFT floor); None on
        the CPU backend or for a device the table does not know."""
        if self.backend.upper() == "CPU" or not self.nameplate:
            return None
        hit = compute_lookup(self.nameplate.chip)
        return hit.fp16_tflops if hit else None

    def calibration(self) -> Calibration:
        """The bound's calibration: the ceiling bandwidth, the host's compute and (on the CPU) the read curve."""
        return Calibration(
            backend=self.backend,
            ceiling_gbs=self.ceiling_gbs,
            compute_gflops=self.compute.f32_gflops if self.compute else None,
            read_curve=self.read_curve if self.backend.upper() == "CPU" else (),  # the host's caches, not a GPU's
            source="bound",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "host": self.host.to_dict(),
            "backend": self.backend,
            "build_id": self.build_id,
            "created_unix_s": self.created_unix_s,
            "memory": self.memory.to_dict(),
            "compute": self.compute.to_dict() if self.compute else None,
            "nameplate": self.nameplate.to_dict() if self.nameplate else None,
            "read_curve": [list(p) for p in self.read_curve],
            "disk": self.disk.to_dict() if self.disk else None,
            "ceiling_gbs": self.ceiling_gbs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, from_cache: bool = False) -> ProbeResult:
        """Inverse of to_dict. Raises KeyError/TypeError/ValueError on a malformed dict."""
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"probe schema {d.get('schema')!r} is not {SCHEMA_VERSION}")
        h = _known(HostInfo, d["host"])
        h.update(
            gpus=tuple(GPUInfo(**_known(GPUInfo, g)) for g in h["gpus"]),
            llama_devices=tuple(LlamaDevice(**_known(LlamaDevice, x)) for x in h.get("llama_devices", ())),
            llama_backends=tuple(h["llama_backends"]),
            warnings=tuple(h.get("warnings", ())),
        )
        return cls(
            host=HostInfo(**h),
            backend=str(d["backend"]),
            build_id=str(d["build_id"]),
            created_unix_s=float(d["created_unix_s"]),
            memory=MemoryProbe(**_positive(_known(MemoryProbe, d["memory"]), _MEMORY_FIGURES)),
            compute=ComputeProbe(**_positive(_known(ComputeProbe, d["compute"]), ("f32_gflops",)))
            if d.get("compute")
            else None,
            nameplate=Nameplate(**_known(Nameplate, d["nameplate"])) if d.get("nameplate") else None,
            read_curve=tuple((int(b), _figure("read_curve", g)) for b, g in d.get("read_curve") or ()),
            disk=DiskProbe(**_known(DiskProbe, d["disk"])) if d.get("disk") else None,
            from_cache=from_cache,
        )


_MEMORY_FIGURES = ("read_gbs", "copy_gbs")
_MAX_FIGURE = 1e7  # GB/s or GFLOP/s: far above any machine, far below overflow


def _figure(name: str, value: Any) -> float:
    """A measured figure read back: a real number, finite, above 0 and below _MAX_FIGURE; ValueError otherwise
    (a cached -1 or 0 GB/s would silently change every prediction)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < _MAX_FIGURE:
        raise ValueError(f"{name} = {value!r} is not a measured figure")
    return float(value)


def _positive(d: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: _figure(k, v) if k in names else v for k, v in d.items()}


def _known(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}
