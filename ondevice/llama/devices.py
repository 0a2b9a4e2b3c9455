"""The devices and backends a llama.cpp build registered, and the defaults that follow from them:
which backend the engine runs on, how many layers it offloads, how many threads it uses.

One home for each rule: "is this backend a GPU", "offload everything when the build can",
"one thread per performance core this process may use".
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from ondevice.core.errors import InvalidParameterError

__all__ = [
    "LlamaDevice",
    "HOST_BACKENDS",
    "is_gpu_backend",
    "llama_devices",
    "detect_backends",
    "default_backend",
    "gpu_layers",
    "default_threads",
]

# Backends that run on the host CPU (BLAS, Accelerate and RPC register alongside the CPU, not as a GPU).
HOST_BACKENDS = frozenset({"CPU", "BLAS", "RPC", "ACCELERATE"})
_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "ACCEL", 3: "IGPU"}  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class LlamaDevice:
    """A device llama.cpp's ggml registered (ggml_backend_dev_*)."""

    name: str  # "CPU", "CUDA0", "Metal", "Vulkan0", ...
    description: str  # the device's name as its backend reports it
    kind: str  # "CPU", "GPU", "ACCEL", "IGPU"
    memory_total_bytes: int | None  # device memory, bytes
    memory_free_bytes: int | None  # free device memory, bytes


def is_gpu_backend(name: str) -> bool:
    return name.upper() not in HOST_BACKENDS


def _ggml(lib: Any = None) -> Any:
    if lib is not None:
        return lib
    import llama_cpp  # noqa: F401 - loads llama.cpp's libraries first
    from llama_cpp._ggml import libggml

    return libggml


def llama_devices(lib: Any = None) -> tuple[LlamaDevice, ...]:
    """ggml's registered devices, through its C API (ctypes); () when that is unavailable."""
    try:
        g = _ggml(lib)
        g.ggml_backend_dev_count.restype = ctypes.c_size_t
        g.ggml_backend_dev_get.restype, g.ggml_backend_dev_get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        for fn in (g.ggml_backend_dev_name, g.ggml_backend_dev_description):
            fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        g.ggml_backend_dev_type.restype, g.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
        size_p = ctypes.POINTER(ctypes.c_size_t)
        g.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
        out = []
        for i in range(int(g.ggml_backend_dev_count())):
            dev = g.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append(
                LlamaDevice(
                    name=(g.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"),
                    description=(g.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                    kind=_DEVICE_KINDS.get(int(g.ggml_backend_dev_type(dev)), "?"),
                    memory_total_bytes=int(total.value) or None,
                    memory_free_bytes=int(free.value) or None,
                )
            )
        return tuple(out)
    except Exception:  # noqa: BLE001 - an old or unusual build: devices unknown, the report goes on
        return ()


def _device_backends() -> list[str]:
    """ggml registry name ("CUDA", "Metal", "Vulkan", "ROCm", "CPU", ...) of each device, through ggml's C API."""
    try:
        g = _ggml()
        g.ggml_backend_dev_count.restype = ctypes.c_size_t
        g.ggml_backend_dev_get.restype, g.ggml_backend_dev_get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        g.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        g.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        g.ggml_backend_reg_name.restype, g.ggml_backend_reg_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        out = []
        for i in range(int(g.ggml_backend_dev_count())):
            reg = g.ggml_backend_dev_backend_reg(g.ggml_backend_dev_get(i))
            out.append((g.ggml_backend_reg_name(reg) or b"?").decode("utf-8", "replace"))
        return list(dict.fromkeys(out))
    except Exception:  # noqa: BLE001 - no such symbols in this build: the caller falls back
        return []


def detect_backends(lib: Any) -> list[str]:
    """Backend names of the devices this llama.cpp build registered, GPUs first, e.g. ['CUDA', 'CPU']."""
    names = _device_backends()
    if not names:  # an unusual build: fall back to the backends llama_print_system_info lists
        try:
            info = (lib.llama_print_system_info() or b"").decode("utf-8", "replace")
        except Exception:  # pragma: no cover - defensive: the function exists in every 0.3.x
            info = ""
        names = list(dict.fromkeys(re.findall(r"(?:^|\|)\s*([A-Za-z][A-Za-z0-9_-]*) : ", info)))
    gpus = [n for n in names if is_gpu_backend(n)]
    return gpus + [n for n in names if n not in gpus] or ["CPU"]


def default_backend(lib: Any = None) -> str:
    """The backend the engine uses by default: the build's GPU backend when it can offload, else "CPU"."""
    if lib is None:
        import llama_cpp as lib
    if not lib.llama_supports_gpu_offload():
        return "CPU"
    first = detect_backends(lib)[0]
    return first if is_gpu_backend(first) else "CPU"


def gpu_layers(lib: Any, n_gpu_layers: Any, n_layer: int | None) -> tuple[int, int]:
    """(value for llama_model_params.n_gpu_layers, layers actually offloaded).

    "auto" and -1 mean every layer (the output layer counts: n_layer + 1) when the build can
    offload; a build without GPU offload gets 0 whatever was asked.
    """
    if n_gpu_layers == "auto":
        requested = -1
    elif isinstance(n_gpu_layers, int) and not isinstance(n_gpu_layers, bool) and n_gpu_layers >= -1:
        requested = n_gpu_layers
    else:
        raise InvalidParameterError(f"n_gpu_layers must be 'auto', -1 (all) or a count >= 0, not {n_gpu_layers!r}")
    if not lib.llama_supports_gpu_offload():
        return 0, 0
    all_layers = (n_layer or 0) + 1  # blocks + output layer
    return requested, all_layers if requested < 0 else min(requested, all_layers)


def default_threads(perf_cores: int | None = None) -> int:
    """One thread per performance core this process may use (llama.cpp's own default is every
    physical core; on Apple silicon the efficiency cores slow a decode step down)."""
    import psutil

    physical = perf_cores or _apple_performance_cores() or psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = os.cpu_count() or physical
    return max(1, min(physical, usable))


def _apple_performance_cores() -> int | None:
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", "hw.perflevel0.physicalcpu"], capture_output=True, text=True, timeout=5)
        return int(out.stdout.strip()) or None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
