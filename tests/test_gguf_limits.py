"""Hostile GGUF input (issue 13), the header reader: its work is bounded by the file (nested
arrays, counts the bytes left cannot hold), and paths that are not regular files get one
clear error instead of a hang."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from gguf import GGUFValueType as VT

from ondevice.core.errors import GGUFFormatError
from ondevice.gguf.reader import ArrayRef, read_gguf
from ondevice.gguf.spec import inspect
from tests.gguf_craft import Parts, array, join, kv, scalar, string


def nested_file(n_arrays: int) -> bytes:
    """A weightless GGUF whose one array holds n empty arrays (12 bytes each)."""
    body = array(VT.ARRAY, [array(VT.UINT8, [])] * n_arrays)
    return join(Parts(3, [kv("general.architecture", VT.STRING, string("llama")), kv("x.nested", VT.ARRAY, body)]))


def measured(fn, *args):
    """(result or exception, CPU seconds, peak bytes traced) of fn(*args). CPU time of this process, not wall-clock:
    another process busy on the machine does not add to it."""
    tracemalloc.start()
    t0 = time.process_time()
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - returned for the caller to check
        result = exc
    seconds = time.process_time() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak


def test_two_million_nested_arrays_take_little_time_and_memory(tmp_path):
    path = tmp_path / "nested.gguf"
    path.write_bytes(nested_file(2_000_000))  # 24 MB
    result, seconds, peak = measured(inspect, path)
    assert isinstance(result, GGUFFormatError) and "nested arrays" in str(result), result
    assert peak < 4 << 20 and seconds < 3, (seconds, peak)


def test_array_count_the_rest_of_the_file_cannot_hold_is_refused_at_once(tmp_path):
    """A count that the bytes left cannot hold (here: arrays of 12 bytes each counted as if 8,
    over zeros, as a misaligned parse sees them) is refused before any item is read."""
    head = join(Parts(3, [kv("general.architecture", VT.STRING, string("llama"))]), n_kv=2)
    key = string("x.zeros") + struct.pack("<II", VT.ARRAY, VT.ARRAY)
    rest = 4 << 20
    path = tmp_path / "zeros.gguf"
    path.write_bytes(head + key + struct.pack("<Q", (rest - 8) // 8) + bytes(rest - 8))
    result, seconds, peak = measured(inspect, path)
    assert isinstance(result, GGUFFormatError) and "cannot fit" in str(result), result
    assert peak < 1 << 20 and seconds < 1, (seconds, peak)


def test_nested_arrays_within_the_limits_are_read_lazily(tmp_path):
    inner = [
        array(
            VT.ARRAY, [array(VT.UINT32, [scalar(VT.UINT32, i), scalar(VT.UINT32, 7)]), array(VT.STRING, [string("ab")])]
        )
        for i in range(3)
    ]
    kvs = [kv("general.architecture", VT.STRING, string("llama")), kv("x.nested", VT.ARRAY, array(VT.ARRAY, inner))]
    path = tmp_path / "ok.gguf"
    path.write_bytes(join(Parts(3, kvs)))
    g = read_gguf(path)
    ref = g.get("x.nested")
    assert isinstance(ref, ArrayRef) and ref.item_type == VT.ARRAY and len(ref) == 3
    level2 = g.read_array(g.read_array(ref)[2])
    assert [g.read_array(r) if isinstance(r, ArrayRef) else r for r in level2] == [[2, 7], ["ab"]]
    too_deep = array(VT.UINT8, [])
    for _ in range(8):
        too_deep = array(VT.ARRAY, [too_deep])
    path.write_bytes(join(Parts(3, [kv("x.deep", VT.ARRAY, too_deep)])))
    with pytest.raises(GGUFFormatError, match="nested too deep"):
        read_gguf(path)


def run_info(path: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ondevice.cli.main", "info", path],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_not_regular(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "not a regular file" in out.stderr, out.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert_one_line_not_regular(run_info(str(fifo)))  # before: blocked in open() until a writer came


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_device_file_is_refused():
    with pytest.raises(GGUFFormatError, match="not a regular file"):
        read_gguf("/dev/null")
    assert_one_line_not_regular(run_info("/dev/null"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
def test_process_substitution_is_refused_as_not_regular(tiny_model):
    cmd = f'"{sys.executable}" -m ondevice.cli.main info <(cat "{tiny_model}")'
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert_one_line_not_regular(out)


def test_read_strings_decodes_a_string_array_and_refuses_any_other(tmp_path):
    words = [f"w{i}" for i in range(100)]  # past SMALL_ARRAY: kept as a reference
    kvs = [
        kv("general.architecture", VT.STRING, string("llama")),
        kv("x.words", VT.ARRAY, array(VT.STRING, [string(w) for w in words])),
        kv("x.numbers", VT.ARRAY, array(VT.UINT32, [scalar(VT.UINT32, i) for i in range(100)])),
    ]
    path = tmp_path / "arrays.gguf"
    path.write_bytes(join(Parts(3, kvs)))
    g = read_gguf(path)
    assert g.read_strings(g.get("x.words")) == words
    with pytest.raises(GGUFFormatError, match="expected an array of strings"):
        g.read_strings(g.get("x.numbers"))
