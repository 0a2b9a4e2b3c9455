"""Probe cache: per machine + backend + build, atomic, aged; probe() reads it unless refreshed."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

import ondevice
from ondevice.probing import cache
from ondevice.probing import probe as run_probe
from ondevice.probing.result import ProbeResult
from tests.file_fakes import stale_temp
from tests.probe_fakes import fake_result, nvidia_host


def test_round_trip_through_json(tmp_path):
    r = fake_result(build="0.3.36.abc", host=nvidia_host(), backend="CUDA")
    path = cache.save(r, root=tmp_path)
    assert path.parent == tmp_path / "probe" and path.name.startswith("cuda-0.3.36.abc-")
    back = cache.load_cached("CUDA", build="0.3.36.abc", root=tmp_path)
    assert back.from_cache and not r.from_cache
    assert back == r  # from_cache is not compared
    assert back.host.gpus[0].name == "NVIDIA GeForce RTX 4090" and back.host.llama_devices[0].name == "CUDA0"
    assert back.read_curve == r.read_curve and back.is_full
    assert 85 < back.age_s < 3600


def test_key_is_backend_and_build(tmp_path):
    cache.save(fake_result(build="A"), root=tmp_path)
    assert cache.load_cached("CPU", build="A", root=tmp_path) is not None
    assert cache.load_cached("cpu", build="A", root=tmp_path) is not None  # backend names are case-blind
    assert cache.load_cached("CPU", build="B", root=tmp_path) is None  # a new llama.cpp build: probe again
    assert cache.load_cached("Metal", build="A", root=tmp_path) is None


@pytest.mark.parametrize(
    "part, other",
    [
        ("node", lambda mp: mp.setattr(cache.platform, "node", lambda: "another-host")),
        ("cpu", lambda mp: mp.setattr(cache.platform, "processor", lambda: "another CPU")),
        ("cores", lambda mp: mp.setattr(cache.psutil, "cpu_count", lambda logical=True: 1000)),
        ("ram", lambda mp: mp.setattr(cache.psutil, "virtual_memory", lambda: SimpleNamespace(total=12345))),
    ],
)
def test_key_is_the_machine(tmp_path, monkeypatch, part, other):
    here = cache.machine_id()
    assert here == cache.machine_id() and len(here) == 12  # stable on one machine
    saved = cache.save(fake_result(build="A"), root=tmp_path)
    assert saved == cache.cache_path("CPU", "A", root=tmp_path) and here in saved.name
    with monkeypatch.context() as mp:
        other(mp)  # the same cache folder seen from a machine that differs in one part
        assert cache.machine_id() != here, part
        assert cache.cache_path("CPU", "A", root=tmp_path) != saved
        assert cache.load_cached("CPU", build="A", root=tmp_path) is None
    assert cache.load_cached("CPU", build="A", root=tmp_path) is not None  # back home: found again


def test_build_id_follows_version_and_system_info():
    a = cache.build_id("0.3.36", "CPU : AVX2 = 1 | ")
    assert a == cache.build_id("0.3.36", "CPU : AVX2 = 1 | ")
    assert a != cache.build_id("0.3.36", "CUDA : ARCHS = 890 | CPU : AVX2 = 1 | ")
    assert a != cache.build_id("0.3.37", "CPU : AVX2 = 1 | ")


def test_a_damaged_cache_is_named_and_another_schema_is_measured_again(tmp_path):
    from ondevice.core.errors import ProbeError

    path = cache.cache_path("CPU", "A", root=tmp_path)
    path.parent.mkdir(parents=True)
    for damaged in ("{not json", json.dumps({"schema": cache.SCHEMA_VERSION, "host": 3}), "[1, 2]"):
        path.write_text(damaged)
        with pytest.raises(ProbeError, match="probe cache .* (unreadable|damaged).*ondevice probe --refresh"):
            cache.load_cached("CPU", build="A", root=tmp_path)
    path.write_text(json.dumps({"schema": 999}))
    assert cache.load_cached("CPU", build="A", root=tmp_path) is None


def test_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(KeyboardInterrupt):
        cache.save(fake_result(build="A"), root=tmp_path)
    assert list((tmp_path / "probe").iterdir()) == []


def test_ceiling_is_the_best_measured_and_nameplate_on_gpu():
    from ondevice.probing.nameplate import lookup

    r = fake_result(build="A", read_gbs=20.0)
    assert r.ceiling_gbs == 20.0  # read 20, copy 18
    curve = replace(r, read_curve=((2 << 20, 90.0), (256 << 20, 24.0)))
    assert curve.ceiling_gbs == 24.0  # the curve's DRAM-sized read counts; its cached sizes do not
    gpu = ProbeResult(**{**r.__dict__, "backend": "CUDA", "nameplate": lookup("RTX 4090")})
    assert gpu.ceiling_gbs == 1008.0
    cal = curve.calibration()
    assert (cal.source, cal.ceiling_gbs, cal.compute_gflops, cal.read_curve) == ("bound", 24.0, 100.0, curve.read_curve)
    assert fake_result(build="A", full=False).calibration().compute_gflops is None


@pytest.fixture(autouse=True)
def small_disk_probe(monkeypatch):
    """The disk read probe runs for real in these tests, on a 16 MiB file instead of up to 512 MiB."""
    from ondevice.probing import host

    real = host.probe_disk
    monkeypatch.setattr(host, "probe_disk", lambda folder, **kw: real(folder, max_bytes=16 << 20, min_bytes=8 << 20))


@pytest.fixture
def fast_probe(monkeypatch):
    """probe() with host arrays of 8 MiB."""
    monkeypatch.setattr("ondevice.probing.host.array_bytes_for", lambda *a, **k: 8 << 20)


def test_probe_measures_once_then_reads_the_cache(tmp_path, fast_probe):
    first = run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1)
    assert not first.from_cache and first.is_full and first.read_curve and first.compute.f32_gflops > 0
    assert first.disk is not None and first.disk.folder == str(tmp_path / "probe") and first.disk.file_bytes == 16 << 20
    assert not [p for p in (tmp_path / "probe").iterdir() if "disk-probe" in p.name]  # its file removed
    second = run_probe(cache_root=tmp_path, backend="CPU")
    assert second.from_cache and second.created_unix_s == first.created_unix_s
    assert second.disk == first.disk  # cached with the rest
    third = run_probe(cache_root=tmp_path, backend="CPU", refresh=True, memory_passes=1)
    assert not third.from_cache and third.created_unix_s >= first.created_unix_s


def test_a_failing_disk_probe_is_no_error(tmp_path, fast_probe, monkeypatch):
    from ondevice.core.errors import ProbeError
    from ondevice.probing import host

    def full_disk(folder, **kw):
        raise ProbeError(f"disk probe: {folder} has 1 MiB free, too little for a 32 MiB test file")

    monkeypatch.setattr(host, "probe_disk", full_disk)
    r = run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1, refresh=True)
    assert r.disk is None and r.memory.read_gbs > 0  # the rest of the probe stands


def test_first_contact_probe_then_the_full_one(tmp_path, fast_probe):
    quick = run_probe(cache_root=tmp_path, full=False, backend="CPU", memory_passes=1)
    assert not quick.is_full and quick.compute is None and quick.read_curve == () and quick.disk is None
    assert run_probe(cache_root=tmp_path, full=False, backend="CPU").from_cache  # a quick one serves a quick ask
    full = run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1)  # the full one wanted: measured
    assert full.is_full and not full.from_cache
    assert run_probe(cache_root=tmp_path, full=False, backend="CPU").is_full  # and it serves both


def test_interrupted_probe_writes_no_cache(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("ondevice.probing.host.array_bytes_for", lambda *a, **k: 8 << 20)
    monkeypatch.setattr("ondevice.probing.host.probe_compute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1)
    assert not list((tmp_path / "probe").glob("*.json"))


def test_unknown_backend_is_refused(tmp_path):
    from ondevice.core.errors import ProbeError

    with pytest.raises(ProbeError, match="not in this llama.cpp build"):
        run_probe(cache_root=tmp_path, backend="CUDA", full=False)


def test_public_name_is_lazy():
    assert ondevice.probe is run_probe


def test_best_of_two_memory_probes():
    from ondevice.probing.host import best_of

    a, b = fake_result(build="A").memory, fake_result(build="A", read_gbs=30.0).memory
    best = best_of(a, b)
    assert (best.read_gbs, best.copy_gbs) == (30.0, 27.0)
    assert best.passes == 10 and best_of(b, a).read_gbs == 30.0
    b = replace(b, read_kernel="memchr")  # the read figure kept says what read it
    assert best_of(a, b).read_kernel == best_of(b, a).read_kernel == "memchr"


def test_probe_measures_memory_before_and_after_the_rest(tmp_path, fast_probe, monkeypatch):
    from ondevice.probing import host

    rates = iter([5.0, 9.0])
    real = host.probe_memory
    monkeypatch.setattr(host, "probe_memory", lambda *a, **k: replace(real(*a, **k), read_gbs=next(rates)))
    r = run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1)
    assert r.memory.read_gbs == 9.0 and r.memory.passes == 2


# ---------- shared state (issue 13) ----------


def test_a_second_probe_waits_for_the_first(tmp_path, fast_probe):
    """Two probes at once would measure each other: the second waits, saying so, then measures."""
    first_inside, second_waits = threading.Event(), threading.Event()
    results, errors, lines = {}, [], []

    def first_progress(msg: str) -> None:
        if msg.startswith("host memory") and not first_inside.is_set():
            first_inside.set()
            second_waits.wait(timeout=120)  # keep measuring until the second probe has started

    def second_progress(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("another probe is running"):
            second_waits.set()

    def run(name, progress):
        try:
            results[name] = run_probe(
                cache_root=tmp_path, backend="CPU", memory_passes=1, refresh=True, progress=progress
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    first = threading.Thread(target=run, args=("first", first_progress))
    first.start()
    assert first_inside.wait(timeout=120)
    run("second", second_progress)
    second_waits.set()  # never leave the first probe waiting, whatever happened
    first.join()
    assert not errors, errors
    assert lines[0] == f"another probe is running (pid {os.getpid()}); waiting"
    assert results["second"].created_unix_s >= results["first"].created_unix_s


def test_a_probe_that_would_wait_too_long_says_so(tmp_path):
    from ondevice.core.errors import ProbeError
    from ondevice.core.filelock import FileLock

    with FileLock(cache.lock_path(tmp_path)):  # another probe holds the lock
        with pytest.raises(ProbeError, match=rf"another probe \(pid {os.getpid()}\) is still running"):
            run_probe(cache_root=tmp_path, backend="CPU", full=False, refresh=True, lock_timeout_s=0)
    assert not list((tmp_path / "probe").glob("*.json"))


def test_probe_removes_what_killed_probes_left(tmp_path, fast_probe):
    cache.probe_dir(tmp_path).mkdir(parents=True)
    stale = [stale_temp(cache.probe_dir(tmp_path), "cpu-x.json")]
    run_probe(cache_root=tmp_path, backend="CPU", memory_passes=1)
    assert not any(p.exists() for p in stale)
