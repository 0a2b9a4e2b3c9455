"""Host probes on small arrays: shapes of the results, STREAM byte counting, bad input. No timed assertions."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from ondevice.core.errors import ProbeError
from ondevice.probing import host
from ondevice.probing.host import MIN_ARRAY_BYTES, QUICK_MIN_ARRAY_BYTES, array_bytes_for, probe_compute, probe_memory

MIB = 1 << 20


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_memory_probe_small_arrays(threads):
    m = probe_memory(threads, 8 * MIB, passes=2)
    assert m.n_threads == threads and m.passes == 2
    assert m.array_bytes % (8 * threads) == 0 and m.array_bytes >= 8 * MIB
    for gbs in (m.read_gbs, m.copy_gbs):
        assert math.isfinite(gbs) and gbs > 0
    assert m.elapsed_s > 0


def test_memory_passes_time_one_pass_at_a_time_and_stop_their_threads():
    """What probe_memory measures with, one pass at a time (benchmarks/host_accuracy.py interleaves
    them with a C kernel's); closed, its threads are gone."""
    with host.MemoryPasses(2, 8 * MIB) as arrays:
        assert arrays.array_bytes >= 8 * MIB and arrays.array_bytes % 16 == 0
        assert 0 < arrays.read_s(1) < 10 and 0 < arrays.copy_s(2) < 10
    with pytest.raises(RuntimeError):  # a shut-down pool takes no more passes
        arrays.read_s(1)


def test_read_kernel_is_libc_memchr_on_glibc_and_macos_else_numpy(monkeypatch):
    """Detected, not assumed: glibc (os.confstr says so) and macOS read with libc's memchr; musl (no such
    confstr name), Windows (no confstr) and anything else with numpy's sum."""
    detect = host._libc_memchr.__wrapped__  # the detection itself, not its cached answer

    def confstr_says(value):
        def confstr(name):
            if isinstance(value, Exception):
                raise value
            return value

        return confstr

    monkeypatch.setattr(host.sys, "platform", "linux")
    monkeypatch.setattr(host.os, "confstr", confstr_says("glibc 2.36"), raising=False)
    if sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
        assert detect() is not None  # this machine's libc has the symbol
    for value in (ValueError("unrecognized configuration name"), None, "musl"):
        monkeypatch.setattr(host.os, "confstr", confstr_says(value), raising=False)
        assert detect() is None
    monkeypatch.delattr(host.os, "confstr", raising=False)
    assert detect() is None
    monkeypatch.setattr(host.sys, "platform", "darwin")  # no glibc question asked there
    monkeypatch.setattr("ctypes.CDLL", lambda name: SimpleNamespace(memchr=lambda *a: None))
    assert detect() is not None


def test_memory_passes_read_with_the_detected_kernel_and_say_which(monkeypatch):
    m = probe_memory(2, 8 * MIB, passes=1)
    assert m.read_kernel == host.read_kernel_name() in ("memchr", "numpy-sum")
    monkeypatch.setattr(host, "_libc_memchr", lambda: None)  # a C library whose memchr is not known to be fast
    m = probe_memory(2, 8 * MIB, passes=1)
    assert m.read_kernel == "numpy-sum" and m.read_gbs > 0


@pytest.mark.skipif(host.read_kernel_name() != "memchr", reason="libc's memchr is not the read kernel here")
def test_a_memchr_pass_that_stops_early_is_an_error_not_a_figure():
    """memchr stops at the byte it looks for: an array holding one would read a fraction of its bytes
    and report a bandwidth far too high."""
    with host.MemoryPasses(2, 8 * MIB) as arrays:
        arrays._a.view(np.uint8)[arrays.array_bytes // 3] = host._ABSENT_BYTE
        with pytest.raises(ProbeError, match="never hold"):
            arrays.read_s(1)


def test_a_cache_from_before_the_read_kernel_was_recorded_says_numpy():
    from ondevice.probing.result import ProbeResult
    from tests.probe_fakes import fake_result

    old = fake_result(build="A").to_dict()
    del old["memory"]["read_kernel"]
    assert ProbeResult.from_dict(old).memory.read_kernel == "numpy-sum"


def test_stream_byte_counting(monkeypatch):
    """read counts 1x the array, copy 2x: with every pass taking the same time, the ratio is exact."""
    monkeypatch.setattr(host, "_best", lambda pool, bounds, passes, kernel: 0.5)
    m = probe_memory(2, 8 * MIB, passes=1)
    assert m.read_gbs == pytest.approx(m.array_bytes / 0.5 / 1e9)
    assert m.copy_gbs == pytest.approx(2 * m.read_gbs)


def test_no_triad_is_reported_or_cached():
    """The triad is gone (numpy's form timed its own overhead, not the memory): the probe has
    no figure for it, and a cache written before (with triad_gbs) still loads."""
    from dataclasses import fields

    from ondevice.probing.host import MemoryProbe
    from ondevice.probing.result import ProbeResult
    from tests.probe_fakes import fake_result

    assert "triad_gbs" not in {f.name for f in fields(MemoryProbe)}
    old = fake_result(build="A").to_dict()
    old["memory"]["triad_gbs"] = 16.0
    loaded = ProbeResult.from_dict(old)
    assert loaded.memory == fake_result(build="A").memory and loaded.ceiling_gbs == fake_result(build="A").ceiling_gbs


def test_slices_cover_the_array_once():
    for n, k in ((10, 3), (8, 8), (100, 7)):
        s = host._slices(n, k)
        assert s[0][0] == 0 and s[-1][1] == n and all(x[1] == y[0] for x, y in zip(s, s[1:]))


def test_pass_runs_every_slice_at_once():
    """The slices of a pass run together (each waits here for the other: run one after the other,
    the barrier would break), and a pass is timed from the first start to the last end."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    together = threading.Barrier(2, timeout=10)
    seen: list[int] = []

    def kernel(lo: int, hi: int) -> None:
        together.wait()
        seen.append(lo)

    with ThreadPoolExecutor(2) as pool:
        took = host._best(pool, [(0, 4), (4, 8)], 3, kernel)
    assert sorted(seen) == [0, 0, 0, 4, 4, 4] and 0 < took < 10


@pytest.mark.parametrize("threads, passes", [(0, 1), (1, 0), (-2, 3)])
def test_memory_probe_bad_arguments(threads, passes):
    with pytest.raises(ProbeError):
        probe_memory(threads, 8 * MIB, passes=passes)


def test_array_size_rules():
    assert array_bytes_for(32 * MIB, 64 << 30) == max(4 * 32 * MIB, MIN_ARRAY_BYTES)
    assert array_bytes_for(256 * MIB, 64 << 30) == 4 * 256 * MIB  # at least 4x the last-level cache
    assert array_bytes_for(None, None) == MIN_ARRAY_BYTES
    assert array_bytes_for(32 * MIB, 1 << 30) == (1 << 30) // 16 // MIB * MIB  # 2 arrays within 1/8 of free RAM
    assert array_bytes_for(32 * MIB, 1) == 8 * MIB  # never below 8 MiB
    # the first-contact probe's floor is lower, never below 4x the last-level cache
    assert array_bytes_for(None, None, floor=QUICK_MIN_ARRAY_BYTES) == QUICK_MIN_ARRAY_BYTES < MIN_ARRAY_BYTES
    assert array_bytes_for(64 * MIB, 64 << 30, floor=QUICK_MIN_ARRAY_BYTES) == 4 * 64 * MIB


def test_compute_probe_small():
    c = probe_compute(budget_s=0.05, max_n=256)
    assert c.matrix_n == 256 and c.f32_gflops > 0 and math.isfinite(c.f32_gflops)


# ---------- disk read probe ----------

SMALL = dict(max_bytes=16 * MIB, min_bytes=8 * MIB)


def test_disk_probe_reads_a_file_not_in_the_page_cache(tmp_path):
    d = host.probe_disk(tmp_path, **SMALL)
    assert d.file_bytes == 16 * MIB and d.folder == str(tmp_path) and d.device == os.stat(tmp_path).st_dev
    assert list(tmp_path.iterdir()) == []  # the test file is gone
    if d.read_gbs is None:  # a RAM-backed tmp folder keeps its pages: no figure, and the reason
        assert "stayed in the page cache" in d.note or "cannot be bypassed" in d.note
        return
    assert math.isfinite(d.read_gbs) and d.read_gbs > 0 and 1 <= d.passes <= 2 and d.elapsed_s > 0
    if sys.platform.startswith("linux"):
        assert d.method.startswith("posix_fadvise") and d.resident_at_read is not None and d.resident_at_read <= 0.05


def test_disk_probe_without_eviction_gives_no_figure(tmp_path, monkeypatch):
    """Where the page cache cannot be dropped, the page cache's speed is not reported as the disk's."""
    from ondevice.core import pagecache

    monkeypatch.setattr(host.sys, "platform", "linux")
    monkeypatch.setattr(
        pagecache,
        "evict_page_cache",
        lambda path: pagecache.Eviction(
            False, "none", 1.0, 1.0, "page-cache eviction is not available on plan9; cold load not measured"
        ),
    )
    d = host.probe_disk(tmp_path, **SMALL)
    assert d.read_gbs is None and d.passes == 0 and "cannot be bypassed" in d.note and d.method == "none"
    assert list(tmp_path.iterdir()) == []


def test_disk_probe_bad_input(tmp_path, monkeypatch):
    for kw in (dict(passes=0), dict(max_bytes=4 * MIB, min_bytes=8 * MIB), dict(budget_s=0)):
        with pytest.raises(ProbeError):
            host.probe_disk(tmp_path, **kw)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ProbeError, match="cannot use"):
        host.probe_disk(blocker / "sub", **SMALL)
    monkeypatch.setattr(host.shutil, "disk_usage", lambda p: SimpleNamespace(total=1 << 40, used=0, free=20 * MIB))
    with pytest.raises(ProbeError, match="too little"):
        host.probe_disk(tmp_path, **SMALL)


def test_disk_probe_in_the_probe_result_and_older_caches():
    from ondevice.probing.host import DiskProbe
    from ondevice.probing.result import ProbeResult
    from tests.probe_fakes import fake_result

    disk = DiskProbe(
        read_gbs=2.5,
        file_bytes=256 * MIB,
        folder="/c/probe",
        device=7,
        method="posix_fadvise",
        resident_at_read=0.0,
        passes=2,
        elapsed_s=1.1,
    )
    r = replace(fake_result(build="A"), disk=disk)
    assert ProbeResult.from_dict(json.loads(json.dumps(r.to_dict()))).disk == disk
    old = r.to_dict()
    del old["disk"]  # a cache written before the disk probe
    assert ProbeResult.from_dict(old).disk is None
