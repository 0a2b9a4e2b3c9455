"""Page-cache eviction/residency and the peak-RSS meter."""

from __future__ import annotations

import mmap
import os
import sys

import psutil
import pytest

from ondevice.bench.oscache import PeakRss
from ondevice.core import pagecache
from ondevice.core.pagecache import evict_files, evict_page_cache, resident_fraction


def test_eviction_reports_what_happened(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(1 << 20))
    before = resident_fraction(f)
    ev = evict_page_cache(f)
    if not sys.platform.startswith("linux"):
        assert not ev.evicted and "not available" in ev.note
        return
    assert before is None or 0.0 <= before <= 1.0
    assert ev.evicted and ev.method.startswith("posix_fadvise")
    assert ev.resident_after is not None and 0.0 <= ev.resident_after <= 1.0
    if ev.resident_after > 0.05:  # e.g. tmpfs keeps its pages: the report must say so
        assert "stayed in the page cache" in ev.note
    else:
        assert ev.note == ""
    with open(f, "rb") as h:
        h.read()
    after_read = resident_fraction(f)
    assert after_read is not None and after_read >= ev.resident_after


def test_eviction_of_a_missing_file_does_not_raise(tmp_path):
    ev = evict_page_cache(tmp_path / "missing.gguf")
    assert not ev.evicted and ev.note


def test_evicting_a_models_files_evicts_each_and_weighs_residency_by_size(tmp_path, monkeypatch):
    small, large = tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"
    small.write_bytes(bytes(1000))
    large.write_bytes(bytes(3000))
    after = {small: 0.0, large: 0.5}
    asked: list = []

    def evict(path):
        asked.append(path)
        return pagecache.Eviction(True, "posix_fadvise(POSIX_FADV_DONTNEED)", 1.0, after[path], "")

    monkeypatch.setattr(pagecache, "evict_page_cache", evict)
    ev = evict_files([small, large])
    assert asked == [small, large] and ev.evicted and ev.resident_before == 1.0
    assert ev.resident_after == pytest.approx(0.375)  # (0 x 1000 + 0.5 x 3000) / 4000
    monkeypatch.undo()
    ev = evict_files([small, tmp_path / "m-00003-of-00003.gguf"])  # a file missing: not all of the model dropped
    assert not ev.evicted and ev.note


def test_resident_fraction_of_an_empty_file(tmp_path):
    f = tmp_path / "empty"
    f.write_bytes(b"")
    assert resident_fraction(f) in (0.0, None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM reset is Linux-only")
def test_peak_rss_is_per_span():
    meter = PeakRss()
    if not meter.method.startswith("VmHWM"):
        pytest.skip("/proc/self/clear_refs not writable here")
    meter.reset()
    before = psutil.Process().memory_info().rss  # the resident set may shrink after the reset (freed memory)
    # an anonymous mapping of its own: fresh pages, and gone when closed (malloc may hand out memory the
    # process already holds, and keep it after a free, depending on what ran before)
    block = mmap.mmap(-1, 64 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    peak = meter.read_bytes()
    # the kernel's resident-set counters are kept per CPU and folded in lazily: a few MB either way
    assert peak - before >= 60 << 20
    block.close()
    meter.reset()
    assert meter.read_bytes() < peak - (32 << 20)
