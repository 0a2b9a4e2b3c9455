"""Measure this machine: the host (memory bandwidth, compute, the caches, the disk), and a model's shape
timed on llama.cpp (probing.timing: what the prediction reads).

    import ondevice
    r = ondevice.probe()                 # cached per machine + backend + llama.cpp build
    r.memory.read_gbs, r.ceiling_gbs, r.age_s

The host probe takes a few seconds and is cached. One probe measures at a time (a lock file in the
probe cache dir). A model's timing is cached per (shape, machine, build, engine settings): timing_for.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.llama.devices import default_backend

__all__ = [
    "probe",
    "cached_probe",
    "default_backend",
    "timing_for",
    "timing_for_header",
    "ProbeResult",
    "LOCK_TIMEOUT_S",
    "WAITING",
]

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


# Two probes at once measure each other (each reads at about half the bandwidth): one probe at a time per cache
# dir, the next waits, for up to this long.
LOCK_TIMEOUT_S = 900.0
WAITING = "another probe is running"  # how the line that says a probe waits for another begins


def probe(
    *,
    refresh: bool = False,
    backend: str | None = None,
    n_threads: int | None = None,
    cache_root: Path | None = None,
    memory_passes: int = 5,
    save: bool = True,
    progress: Progress | None = None,
    lock_timeout_s: float | None = LOCK_TIMEOUT_S,
    full: bool = True,
):
    """This machine's ProbeResult for `backend` (default: the engine's), from the cache unless `refresh`;
    else measured now and cached (written atomically, only once complete).

    full=False is the first-contact probe: memory bandwidth only (no compute figure, no read curve over
    working-set sizes, no disk read); a cached full probe is used when there is one, and a cached quick one
    satisfies full=False. One probe measures at a time: another one waits (progress says so), for at most
    lock_timeout_s (None: no limit), then raises ProbeError.
    """
    from ondevice.llama.build import build_id
    from ondevice.probing import cache

    say = progress or (lambda _msg: None)
    backend = backend or default_backend()
    build = build_id()

    def cached():
        found = None if refresh else cache.load_cached(backend, build=build, root=cache_root)
        return found if found is not None and (found.is_full or not full) else None

    if (found := cached()) is not None:
        return found
    with _one_at_a_time(cache_root, lock_timeout_s, say):
        if (found := cached()) is not None:  # measured by the probe this one waited for
            return found
        paths.remove_stale_temps(cache.probe_dir(cache_root), owned=True)  # what killed probes left
        result = _measure(backend, build, n_threads, cache_root, memory_passes, say, full)
        if save:
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


def _measure(
    backend: str,
    build: str,
    n_threads: int | None,
    cache_root: Path | None,
    memory_passes: int,
    say: Progress,
    full: bool,
):
    """Measure the host now: memory bandwidth, and with `full` compute, the read curve and the disk."""
    from ondevice.core.errors import ProbeError
    from ondevice.probing import cache, hardware
    from ondevice.probing.host import (
        MIN_ARRAY_BYTES,
        QUICK_MIN_ARRAY_BYTES,
        array_bytes_for,
        best_of,
        probe_compute,
        probe_memory,
    )
    from ondevice.probing.nameplate import lookup
    from ondevice.probing.readcurve import probe_read_curve
    from ondevice.probing.result import ProbeResult

    host = hardware.detect()  # reads the system info itself, and lists llama.cpp's devices
    if backend.upper() != "CPU" and host.accelerator_backend.upper() != backend.upper():
        raise ProbeError(f"backend {backend!r} is not in this llama.cpp build ({host.accelerator_backend})")
    threads = n_threads or hardware.default_threads(host)
    floor = MIN_ARRAY_BYTES if full else QUICK_MIN_ARRAY_BYTES
    array_bytes = array_bytes_for(host.llc_bytes, host.ram_available_bytes, floor=floor)
    say(f"host memory bandwidth ({threads} threads)")
    memory = probe_memory(threads, array_bytes, passes=memory_passes)
    compute = curve = disk = None
    if full:
        say("host f32 compute")
        compute = probe_compute()
        say("read bandwidth over working-set sizes (the caches)")
        curve = probe_read_curve(threads, array_bytes)
        disk = _disk(cache.probe_dir(cache_root), say)
        say("host memory bandwidth, again")  # a busy moment at the start must not lower the ceiling
        memory = best_of(memory, probe_memory(threads, array_bytes, passes=memory_passes))
    chip = host.apple_chip if backend.upper() == "CPU" else host.chip_name
    return ProbeResult(
        host=host,
        backend=backend,
        build_id=build,
        created_unix_s=time.time(),
        memory=memory,
        compute=compute,
        nameplate=lookup(chip),
        read_curve=curve or (),
        disk=disk,
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


def timing_for(
    engine: Any,
    *,
    plan: Any = None,
    progress: Progress | None = None,
    refresh: bool = False,
    cache_root: Path | None = None,
):
    """The ShapeTiming of the engine's model on this machine with the engine's settings: cached (a quick timing
    serves only a quick plan), else timed now and cached: on the engine itself for a model of few bytes, else
    on twins of fewer blocks, holding the model's own bytes, with the engine's settings (probing.twins). plan:
    probing.plans.FULL by default."""
    from ondevice.probing import cache
    from ondevice.probing.plans import FULL
    from ondevice.probing.timing import time_engine
    from ondevice.probing.timingcache import load_timing, save_timing, timing_key
    from ondevice.probing.twins import time_header, twin_blocks
    from ondevice.quant.twin import leading_blocks, read_header, shape_key

    plan = plan or FULL
    header = read_header(engine.info.model_path)
    key = timing_key(shape_key(header), engine.info)
    found = None if refresh else load_timing(key, cache_root)
    if found is not None and (found.plan == "full" or plan.name == "quick"):
        return found
    if twin_blocks(engine.info.spec, leading_blocks(header)) is None:
        with _with_room(engine, plan) as timed:
            timing = time_engine(timed, plan, progress=progress)
    else:
        work = cache.probe_dir(cache_root) / "twins"
        timing, _info = time_header(
            header,
            engine.info.spec,
            plan=plan,
            work_dir=work,
            engine_args=twin_engine_args(engine.info),
            progress=progress,
            model_path=engine.info.model_path,
        )
    try:
        save_timing(key, timing, cache_root)
    except OSError as exc:  # a read-only cache: the timing still serves this run
        log.warning("timing not cached: %s", exc)
    return timing


@contextlib.contextmanager
def _with_room(engine: Any, plan: Any) -> Iterator[Any]:
    """The engine, or, where its context is shorter than the plan needs (probing.plans.plan_context) and the model's
    trained context longer, a sibling on its model with that context, closed after: the plan is not cut to a short
    context (a quick bench's 256 tokens), whose timing, cached under settings that leave the context out, would
    serve every context with its chunks too short for a longer prompt."""
    from ondevice.probing.plans import plan_context

    info = engine.info
    need = min(plan_context(plan, info.n_ubatch), info.spec.n_ctx_train or TWIN_N_CTX)
    if info.n_ctx >= need:
        yield engine
        return
    with contextlib.closing(engine.sibling(need)) as roomy:
        yield roomy


TWIN_N_CTX = 4096  # context of a twin's engine: room for the timing plan's chunks and chain


def twin_n_ctx(spec: Any) -> int:
    """A twin engine's context: TWIN_N_CTX, or the model's trained context when that is shorter."""
    return min(TWIN_N_CTX, spec.n_ctx_train or TWIN_N_CTX)


def twin_engine_args(info: Any) -> dict[str, Any]:
    """ondevice.engine.load arguments that give a twin the settings of the engine it stands in for."""
    offload = 0 if not info.n_gpu_layers else "auto"  # a twin has fewer blocks: offloaded all, or none
    return dict(
        n_ctx=TWIN_N_CTX,
        n_threads=info.n_threads,
        n_gpu_layers=offload,
        n_batch=info.n_batch,
        n_ubatch=info.n_ubatch,
        flash_attn=info.flash_attn,
        cache_type_k=info.cache_type_k,
        cache_type_v=info.cache_type_v,
    )


def timing_for_header(
    header: Any,
    spec: Any,
    *,
    plan: Any = None,
    engine_args: dict[str, Any] | None = None,
    progress: Progress | None = None,
    refresh: bool = False,
    cache_root: Path | None = None,
):
    """The ShapeTiming of a model known by its header alone (a config.json, a file not downloaded): cached under
    its shape and the engine arguments asked, else timed now on its twins (probing.twins) and cached. plan:
    probing.plans.UNBATCHED by default (decode and prefill, no batched steps)."""
    from ondevice.probing import cache
    from ondevice.probing.plans import UNBATCHED
    from ondevice.probing.timingcache import load_timing, requested_key, save_timing
    from ondevice.probing.twins import time_header
    from ondevice.quant.twin import shape_key

    plan, args = plan or UNBATCHED, {"n_ctx": twin_n_ctx(spec), **(engine_args or {})}
    key = requested_key(shape_key(header), args)
    found = None if refresh else load_timing(key, cache_root)
    if found is not None and (found.plan == "full" or plan.name == "quick"):
        return found
    timing, _info = time_header(
        header, spec, plan=plan, work_dir=cache.probe_dir(cache_root) / "twins", engine_args=args, progress=progress
    )
    try:
        save_timing(key, timing, cache_root)
    except OSError as exc:
        log.warning("timing not cached: %s", exc)
    return timing
