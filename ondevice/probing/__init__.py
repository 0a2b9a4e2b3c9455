"""Measure this machine: host memory bandwidth and compute, and llama.cpp's own decode kernels.

    import ondevice
    r = ondevice.probe()                 # cached per machine + backend + llama.cpp build
    r.memory.read_gbs, r.kernel.type_gbs, r.kernel.t0_s, r.age_s

The host probe takes a few seconds; the kernel probe up to a minute the first time (it
builds its synthetic models once, in the cache dir) and is cached afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

__all__ = ["probe", "default_backend", "ProbeResult"]

Progress = Callable[[str], None]


def __getattr__(name: str):
    if name == "ProbeResult":
        from ondevice.probing.result import ProbeResult

        return ProbeResult
    raise AttributeError(name)


def default_backend() -> str:
    """The backend the engine uses by default: the build's GPU backend when it can offload, else "CPU"."""
    import llama_cpp

    from ondevice.hardware import parse_system_info

    if not llama_cpp.llama_supports_gpu_offload():
        return "CPU"
    raw = llama_cpp.llama_print_system_info()
    backends, _ = parse_system_info(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
    gpu = [b for b in backends if b.upper() not in ("CPU", "BLAS", "RPC")]
    return gpu[0] if gpu else "CPU"


def probe(*, refresh: bool = False, kernel: bool = True, backend: str | None = None, n_threads: int | None = None,
          cache_root: Path | None = None, plan=None, memory_passes: int = 5, save: bool = True,
          progress: Progress | None = None):
    """This machine's ProbeResult for `backend` (default: the engine's), from the cache unless
    `refresh`; else measured now and cached (written atomically, only once complete).

    kernel=False skips the llama.cpp kernel probe (no calibrated predictions then).
    plan: a probing.kernel.KernelPlan (model sizes; tests pass tiny ones).
    """
    from ondevice import hardware
    from ondevice.errors import ProbeError
    from ondevice.llama.build import build_id
    from ondevice.nameplate import lookup
    from ondevice.probing import cache
    from ondevice.probing.host import array_bytes_for, best_of, probe_compute, probe_memory
    from ondevice.probing.result import ProbeResult

    say = progress or (lambda _msg: None)
    backend = backend or default_backend()
    build = build_id()
    if not refresh:
        cached = cache.load_cached(backend, build=build, root=cache_root)
        if cached is not None and (cached.kernel is not None or not kernel):
            return cached
    host = hardware.detect()  # reads the system info itself, and lists llama.cpp's devices
    if backend.upper() != "CPU" and host.accelerator_backend.upper() != backend.upper():
        raise ProbeError(f"backend {backend!r} is not in this llama.cpp build ({host.accelerator_backend})")
    threads = n_threads or hardware.default_threads(host)
    array_bytes = array_bytes_for(host.llc_bytes, host.ram_available_bytes)
    say(f"host memory bandwidth ({threads} threads)")
    memory = probe_memory(threads, array_bytes, passes=memory_passes)
    say("host f32 compute")
    compute = probe_compute()
    kernel_result = None
    if kernel:
        from ondevice.probing.kernel import plan_for, probe_kernels

        kernel_result = probe_kernels(plan or plan_for(host.llc_bytes), cache.probe_dir(cache_root) / "models",
                                      n_threads=n_threads, n_gpu_layers=0 if backend.upper() == "CPU" else -1,
                                      progress=say)
        say("host memory bandwidth, again")  # a busy moment at the start must not lower the ceiling
        memory = best_of(memory, probe_memory(threads, array_bytes, passes=memory_passes))
    chip = host.apple_chip if backend.upper() == "CPU" else host.chip_name
    result = ProbeResult(host=host, backend=backend, build_id=build, created_unix_s=time.time(), memory=memory,
                         compute=compute, kernel=kernel_result, nameplate=lookup(chip))
    if save:
        cache.save(result, root=cache_root)
    return result
