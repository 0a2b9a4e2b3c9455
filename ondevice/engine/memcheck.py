"""Memory before a load: what is free (RAM, and the GPU's own memory as ggml reports it), what the load
will take (ondevice.roofline.memory), and a refusal with both figures when it will not fit, so that a
load never ends in an allocation failure inside llama.cpp."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core.errors import InsufficientMemoryError
from ondevice.gguf.spec import ModelSpec
from ondevice.llama.devices import is_gpu_backend, llama_devices
from ondevice.roofline.memory import FitChoice, MemoryNeed, fit_memory, memory_need

__all__ = ["FreeMemory", "free_memory", "check_memory", "choose_fit", "repacked_bytes_here", "backend_for", "plan_fit"]


@dataclass(frozen=True)
class FreeMemory:
    host_bytes: int  # RAM available to a new allocation (psutil's "available")
    device_bytes: int | None  # free memory of the GPUs llama.cpp registered (None: no GPU device)
    unified: bool  # the GPU shares RAM (Metal): device_bytes is the share it may use


def free_memory(backend: str, devices: Any = None) -> FreeMemory:
    """What is free now. devices: llama_devices()' answer (injectable for tests)."""
    import psutil

    host = int(psutil.virtual_memory().available)
    if not is_gpu_backend(backend):
        return FreeMemory(host, None, False)
    gpus = [d for d in (llama_devices() if devices is None else devices) if d.kind in ("GPU", "IGPU")]
    free = sum(d.memory_free_bytes or 0 for d in gpus) or None
    return FreeMemory(host, free, backend.lower() == "metal" or any(d.kind == "IGPU" for d in gpus))


def repacked_bytes_here(path: Path | None, backend: str, offloaded: int, n_layer: int | None, lib: Any = None) -> int:
    """Weights CPU_REPACK copies on this machine when layers stay on the CPU (0 with everything offloaded or
    when the crash guard allows no extra buffers)."""
    from ondevice.llama.guard import cpu_buffer_verdict

    if path is None or (is_gpu_backend(backend) and offloaded > (n_layer or 0)):
        return 0
    if cpu_buffer_verdict().mode == "none":
        return 0
    st = Path(path).stat()
    return _repacked(str(path), st.st_size, st.st_mtime_ns, lib)


@functools.lru_cache(maxsize=16)
def _repacked(path: str, _size: int, _mtime_ns: int, lib: Any) -> int:
    """repacked_bytes, once per file version in a process (it reads the tensor table: ~0.1 s for the default model)."""
    from ondevice.llama.model import repacked_bytes

    return repacked_bytes(path, lib)


def _need(spec, free, *, n_ctx, n_ubatch, flash_attn, backend, offloaded, repacked) -> MemoryNeed:
    return memory_need(
        spec,
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        flash_attn=flash_attn is not False,
        backend=backend,
        n_gpu_layers=offloaded,
        unified=free.unified,
        repacked_bytes=repacked,
    )


def check_memory(
    spec: ModelSpec,
    free: FreeMemory,
    *,
    n_ctx: int,
    n_ubatch: int,
    flash_attn: Any,
    backend: str,
    offloaded: int,
    repacked: int = 0,
) -> MemoryNeed:
    """The need of this load; InsufficientMemoryError (needed, available) when it exceeds what is free."""
    need = _need(
        spec,
        free,
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        flash_attn=flash_attn,
        backend=backend,
        offloaded=offloaded,
        repacked=repacked,
    )
    checks = [(need.host_bytes, free.host_bytes, "unified memory" if free.unified else "RAM")]
    if need.device_bytes and free.device_bytes is not None:
        checks.append((need.device_bytes, free.device_bytes, f"{backend} device memory"))
    for needed, available, where in checks:
        if needed > available:
            raise InsufficientMemoryError(
                f"{spec.name or spec.path}: needs {needed / 1e9:.2f} GB of {where} at {n_ctx} tokens of context"
                + (f" with {offloaded} layers offloaded" if need.device_bytes else "")
                + f", {available / 1e9:.2f} GB available: use a smaller context (-c), a smaller KV type (-ctk/-ctv "
                "q8_0) or --fit",
                needed_bytes=needed,
                available_bytes=available,
                where=where,
            )
    return need


def choose_fit(
    spec: ModelSpec, free: FreeMemory, *, ctx_max: int, n_ubatch: int, flash_attn: Any, backend: str, repacked: int
) -> FitChoice:
    """--fit: the largest context up to ctx_max and the most GPU layers that fit (roofline.memory.fit_memory)."""
    return fit_memory(
        spec,
        ctx_max=ctx_max,
        backend=backend,
        device_free_bytes=free.device_bytes,
        host_free_bytes=free.host_bytes,
        n_ubatch=n_ubatch,
        flash_attn=flash_attn is not False,
        unified=free.unified,
        repacked_bytes=repacked,
    )


def backend_for(lib: Any, offloaded: int) -> str:
    """The backend a load with `offloaded` layers runs on: the build's GPU backend, or "CPU"."""
    from ondevice.llama.devices import detect_backends

    first = detect_backends(lib)[0]
    return first if (offloaded and is_gpu_backend(first)) else "CPU"


def plan_fit(
    path: Path | None,
    spec: ModelSpec,
    *,
    ctx_max: int,
    n_ubatch: int | None,
    flash_attn: Any,
    n_gpu_layers: Any = "auto",
    lib: Any = None,
) -> FitChoice:
    """--fit for a model on this machine, before loading it: the context and GPU layers (engine.load's
    n_ctx and n_gpu_layers) that fit what is free now, and why."""
    from ondevice.llama.devices import gpu_layers
    from ondevice.llama.model import llama_lib

    lib = lib or llama_lib()
    _requested, offloaded = gpu_layers(lib, n_gpu_layers, spec.n_layer)
    backend = backend_for(lib, offloaded)
    free = free_memory(backend)
    repacked = repacked_bytes_here(path, backend, offloaded, spec.n_layer, lib)
    return choose_fit(
        spec,
        free,
        ctx_max=ctx_max,
        n_ubatch=n_ubatch or 512,
        flash_attn=flash_attn,
        backend=backend,
        repacked=repacked,
    )
