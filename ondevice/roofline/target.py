"""What a prediction knows about the device it is for, beyond bandwidth: the compute behind the
TTFT floor, the memory the verdict weighs against, the backend the estimate is fitted for.

Two cases. A machine you do not have (spec mode: `--device`, `--backend`, `--compute`,
`--memory`, `--unified`) is a Target. This machine is its probe: on a GPU backend whose device
the nameplate table knows, the TTFT floor uses the device's peak FP16 instead of the host CPU's
measured f32 (the probe exposes it as device_fp16_tflops); without it the floor stays the host's,
and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ondevice.core.errors import InvalidParameterError
from ondevice.roofline.estimate import canonical_backend
from ondevice.roofline.spec import positive_number

__all__ = ["Target", "make_target", "ttft_compute", "UNIFIED_GPU_SHARE", "GIB"]

UNIFIED_GPU_SHARE = 0.75  # share of unified memory a GPU may wire (macOS default working-set limit)
GIB = 1 << 30  # makers' "GB" of memory are GiB: a "12 GB" card holds 12 GiB
MOST_MEMORY_GB = 65536.0  # beyond any one machine's memory (64 TiB): a typo, not a machine
MOST_TFLOPS = 1e5  # likewise for peak FP16 compute


@dataclass(frozen=True)
class Target:
    """A machine you do not have, as described on the command line or to ondevice.predict()."""

    backend: str | None  # "CUDA", "Metal", "ROCm", "Vulkan", "CPU"; None: not given (pooled estimate)
    device: str | None  # chip or card name as given, for notes
    compute_tflops: float | None  # peak FP16 TFLOPS for the TTFT floor (None: unknown)
    compute_source: str  # "given", or where the table's figure comes from; "" when unknown
    memory_bytes: int | None  # memory the model may occupy there, bytes (None: unknown)
    memory_where: str  # "VRAM", "unified memory" or "RAM"
    memory_total_bytes: int | None = None  # the memory as given (unified: before the GPU share), bytes


def make_target(
    *,
    backend: str | None = None,
    device: str | None = None,
    compute_tflops=None,
    memory_gb=None,
    unified: bool | None = None,
    device_compute=None,
    device_unified: bool | None = None,
    device_backend: str | None = None,
) -> Target:
    """A Target from flags; device_* are what the nameplate table says of `device` (the caller looks them up).

    Unified memory (Apple silicon, Strix Halo): the GPU may use UNIFIED_GPU_SHARE of it, as llama.cpp
    on macOS is allowed by default; VRAM: all of it; backend CPU: RAM. Raises InvalidParameterError."""
    name = None
    if backend is not None:
        name = canonical_backend(backend)
        if name is None:
            raise InvalidParameterError(f"--backend must be one of CUDA, Metal, ROCm, Vulkan, CPU, not {backend!r}")
    name = name or device_backend
    tflops = (
        positive_number("--compute", compute_tflops, InvalidParameterError, unit="TFLOPS", most=MOST_TFLOPS)
        if compute_tflops is not None
        else None
    )
    source = "given" if tflops is not None else ""
    if tflops is None and device_compute is not None:
        tflops, source = device_compute.fp16_tflops, f"nameplate: {device_compute.source}"
    total = (
        int(positive_number("--memory", memory_gb, InvalidParameterError, unit="GB", most=MOST_MEMORY_GB) * GIB)
        if memory_gb is not None
        else None
    )
    is_unified = unified or bool(device_unified) or name == "Metal"  # Metal runs on Apple's unified memory
    where = "RAM" if name == "CPU" else "unified memory" if is_unified else "VRAM"
    usable = int(total * UNIFIED_GPU_SHARE) if total is not None and where == "unified memory" else total
    return Target(
        backend=name,
        device=device,
        compute_tflops=tflops,
        compute_source=source,
        memory_bytes=usable,
        memory_where=where,
        memory_total_bytes=total,
    )


def ttft_compute(
    backend: str, host_gflops: float | None, probe=None, target: Target | None = None
) -> tuple[float | None, str | None]:
    """(GFLOP/s for the TTFT floor, a note or None).

    A target's compute when it has one (none: no floor, this machine's CPU says nothing of
    another device); else, on a GPU backend, the probed device's nameplate FP16
    (probe.device_fp16_tflops); else the host CPU's measured f32, with a note on a GPU backend."""
    if target is not None:
        if target.compute_tflops:
            whose = f"{target.device}'s " if target.device else ""
            label = "given" if target.compute_source == "given" else "the maker's peak"
            return target.compute_tflops * 1e3, (
                f"TTFT floor uses {whose}{target.compute_tflops:g} TFLOPS FP16 ({label}, which prefill does not reach)"
            )
        return None, "no TTFT floor: the device's compute is unknown (give --compute TFLOPS or a known --device)"
    gpu = backend.upper() != "CPU"
    device_tflops = getattr(probe, "device_fp16_tflops", None) if gpu else None
    if device_tflops:
        return device_tflops * 1e3, (
            f"TTFT floor uses the {backend} device's {device_tflops:g} TFLOPS FP16 "
            "(the maker's peak, which prefill does not reach)"
        )
    if gpu and host_gflops:
        return host_gflops, "TTFT floor uses the host CPU's measured compute (device unknown); a GPU prefills faster"
    return host_gflops, None
