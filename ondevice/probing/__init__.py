"""Measure this machine: host memory bandwidth and compute, and llama.cpp's own decode kernels.

    import ondevice
    r = ondevice.probe()                 # cached per machine + backend + llama.cpp build
    r.memory.read_gbs, r.kernel.type_gbs, r.kernel.t0_s, r.age_s

The host probe takes a few seconds; the kernel probe up to a minute the first time (it
builds its synthetic models once, in the cache dir) and is cached afterwards. One probe
measures at a time (a lock file in the probe cache dir); a measurement whose passes disagree
too much is refused rather than cached.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ondevice.core import paths
from ondevice.llama.devices import default_backend

__all__ = ["probe", "cached_probe", "default_backend", "ProbeResult", "LOCK_TIMEOUT_S", "MAX_PASS_SPREAD", "WAITING"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def __getattr__(name: str):
    if name == "ProbeResult":
        from ondevice.probing.result import ProbeResult

        return ProbeResult
    raise AttributeError(name)


def cached_probe(backend: str | None = None, *, cache_root: Path | None = None):
    """This machine's cached ProbeResult for `backend` (default: the engine's), for this llama.cpp
    build; None when none is cached or the file is unreadable. Never measures."""
    from ondevice.probing import cache

    return cache.load_cached(backend or default_backend(), root=cache_root)


# Two probes at once measure each other (host read fell from 29 to 15 GB/s, a kernel from 14 to
# 1.3 GB/s): one probe at a time per cache dir, the next waits, for up to this long (a first
# kernel probe on a slow machine builds its models and takes several minutes).
LOCK_TIMEOUT_S = 900.0
# The kernel probe decodes every model in several passes (pass_spread: slowest / fastest - 1 on
# the large models). On a quiet machine the passes agree within a few percent (0.03 measured);
# with a second probe running alongside they differed by 109%. 25% leaves room for ordinary
# drift (turbo, thermals, a browser tab) while refusing contention of that kind: a calibration
# that far off would skew every prediction made from it until the next probe, so it is not cached.
MAX_PASS_SPREAD = 0.25
WAITING = "another probe is running"  # how the line that says a probe waits for another begins


def probe(
    *,
    refresh: bool = False,
    kernel: bool = True,
    backend: str | None = None,
    n_threads: int | None = None,
    cache_root: Path | None = None,
    plan=None,
    memory_passes: int = 5,
    save: bool = True,
    progress: Progress | None = None,
    lock_timeout_s: float | None = LOCK_TIMEOUT_S,
    disk: bool = True,
):
    """This machine's ProbeResult for `backend` (default: the engine's), from the cache unless
    `refresh`; else measured now and cached (written atomically, only once complete).

    kernel=False skips the llama.cpp kernel probe (no calibrated predictions then); disk=False
    the disk read (about a second: no cold-start prediction then).
    plan: a probing.kernel.KernelPlan (model sizes; tests pass tiny ones).
    One probe measures at a time: another one waits (progress says so), for at most
    lock_timeout_s (None: no limit), then raises ProbeError. A measurement whose kernel passes
    differ by more than MAX_PASS_SPREAD raises ProbeError and is not cached (the cached one stays).
    """
    from ondevice.llama.build import build_id
    from ondevice.probing import cache

    say = progress or (lambda _msg: None)
    backend = backend or default_backend()
    build = build_id()

    def cached():
        found = None if refresh else cache.load_cached(backend, build=build, root=cache_root)
        return found if found is not None and (found.kernel is not None or not kernel) else None

    if (found := cached()) is not None:
        return found
    with _one_at_a_time(cache_root, lock_timeout_s, say):
        if (found := cached()) is not None:  # measured by the probe this one waited for
            return found
        for folder in (cache.probe_dir(cache_root), cache.probe_dir(cache_root) / "models"):
            paths.remove_stale_temps(folder, owned=True)  # what killed probes left
        result = _measure(backend, build, kernel, n_threads, cache_root, plan, memory_passes, say, disk)
        if save:
            _check_passes(result)
            cache.save(result, root=cache_root)
    return result


@contextlib.contextmanager
def _one_at_a_time(cache_root: Path | None, timeout_s: float | None, say: Progress) -> Iterator[None]:
    """Hold the probe cache's lock (waiting for another probe, saying so) while measuring."""
    from ondevice.core.errors import ProbeError
    from ondevice.core.filelock import FileLock, LockTimeout
    from ondevice.probing import cache

    lock = FileLock(cache.lock_path(cache_root))
    try:
        lock.acquire(timeout_s=timeout_s, on_wait=lambda pid: say(f"{WAITING} (pid {pid if pid else '?'}); waiting"))
    except LockTimeout as exc:
        raise ProbeError(
            f"another probe (pid {exc.pid if exc.pid else '?'}) is still running after {timeout_s:g} s; "
            "run this one when it has finished"
        ) from None
    except OSError as exc:  # a read-only cache dir: measure unlocked (saving will fail on its own)
        log.debug("probe lock %s not taken: %s", lock.path, exc)
    try:
        yield
    finally:
        lock.release()


def _check_passes(result) -> None:
    from ondevice.core.errors import ProbeError

    k = result.kernel
    if k is not None and k.pass_spread > MAX_PASS_SPREAD:
        raise ProbeError(
            f"kernel probe passes differed by {100 * k.pass_spread:.0f}% (more than "
            f"{100 * MAX_PASS_SPREAD:.0f}%): something else was using the machine, so this measurement "
            "was not cached (an earlier one is kept); probe again when the machine is quiet"
        )


def _measure(
    backend: str,
    build: str,
    kernel: bool,
    n_threads: int | None,
    cache_root: Path | None,
    plan,
    memory_passes: int,
    say: Progress,
    disk: bool = True,
):
    """Measure the host, its disk (disk=True) and (kernel=True) llama.cpp's decode kernels now."""
    from ondevice.core.errors import ProbeError
    from ondevice.probing import cache, hardware
    from ondevice.probing.host import array_bytes_for, best_of, probe_compute, probe_memory
    from ondevice.probing.nameplate import lookup
    from ondevice.probing.result import ProbeResult

    host = hardware.detect()  # reads the system info itself, and lists llama.cpp's devices
    if backend.upper() != "CPU" and host.accelerator_backend.upper() != backend.upper():
        raise ProbeError(f"backend {backend!r} is not in this llama.cpp build ({host.accelerator_backend})")
    threads = n_threads or hardware.default_threads(host)
    array_bytes = array_bytes_for(host.llc_bytes, host.ram_available_bytes)
    say(f"host memory bandwidth ({threads} threads)")
    memory = probe_memory(threads, array_bytes, passes=memory_passes)
    say("host f32 compute")
    compute = probe_compute()
    disk_result = _disk(cache.probe_dir(cache_root), say) if disk else None
    kernel_result, curve = None, ()
    if kernel:
        from ondevice.probing.readcurve import best_curve, probe_read_curve

        say("read bandwidth over working-set sizes (the caches)")
        curve = probe_read_curve(threads, array_bytes)
        from ondevice.probing.kernel import plan_for, probe_kernels

        kernel_result = probe_kernels(
            plan or plan_for(host.llc_bytes),
            cache.probe_dir(cache_root) / "models",
            n_threads=n_threads,
            n_gpu_layers=0 if backend.upper() == "CPU" else -1,
            progress=say,
        )
        say("host memory bandwidth, again")  # a busy moment at the start must not lower the ceiling
        memory = best_of(memory, probe_memory(threads, array_bytes, passes=memory_passes))
        say("read bandwidth over working-set sizes (the caches)")
        curve = best_curve(curve, probe_read_curve(threads, array_bytes))
    chip = host.apple_chip if backend.upper() == "CPU" else host.chip_name
    return ProbeResult(
        host=host,
        backend=backend,
        build_id=build,
        created_unix_s=time.time(),
        memory=memory,
        compute=compute,
        kernel=kernel_result,
        nameplate=lookup(chip),
        read_curve=curve,
        disk=disk_result,
    )


def _disk(folder: Path, say: Progress):
    """The disk read probe in the probe cache's folder; None (logged) when it cannot run there."""
    from ondevice.core.errors import ProbeError
    from ondevice.probing.host import probe_disk

    say("disk sequential read (page cache dropped)")
    try:
        return probe_disk(folder)
    except ProbeError as exc:
        log.warning("%s", exc)
        return None
