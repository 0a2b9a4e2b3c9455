"""Hostile stored files and outputs: special files, huge or deep files, damaged probe figures,
an existing export, control characters in names. Every case ends in a typed error (one line
from the CLI, exit 2) or a cleaned string; none hangs, grows without bound or tracebacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ondevice.bench.compare import load_results
from ondevice.cli.main import main
from ondevice.core.errors import BenchError, ProbeError
from ondevice.core.stored import StoredFileError, load_json, load_toml, read_regular_file
from ondevice.core.textclean import printable
from ondevice.probing import cache
from tests.probe_fakes import fake_result


def _special(tmp_path: Path, kind: str) -> Path:
    """A path that is not a regular file: a FIFO (no writer: opening it blocking would hang),
    a directory, or a link to /dev/zero (reading it would never end)."""
    path = tmp_path / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    return path


SPECIAL = ["fifo", "dir", "devzero"]


@pytest.mark.parametrize("kind", SPECIAL)
def test_read_regular_file_refuses_special_files(tmp_path, kind):
    with pytest.raises(StoredFileError, match="not a regular file|cannot open"):
        read_regular_file(_special(tmp_path, kind), 1 << 20)


def test_read_regular_file_bounds_size_and_passes_absent_through(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 1001)
    with pytest.raises(StoredFileError, match="larger than 1000 bytes"):
        read_regular_file(big, 1000)
    assert read_regular_file(big, 1001) == b" " * 1001
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "absent", 10)


@pytest.mark.parametrize(
    "text, match",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ('{"a": NaN}', "not JSON"),
        ('{"a": Infinity}', "not JSON"),
        ('{"a": 1', "not JSON"),
    ],
)
def test_load_json_refuses_deep_and_non_finite(tmp_path, text, match):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(StoredFileError, match=match):
        load_json(path, 1 << 20)


def test_load_json_keeps_brackets_inside_strings(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"note": "[" * 500 + '\\"{'}))
    assert load_json(path, 1 << 20)["note"].startswith("[[[")


def test_load_toml_refuses_deep_nesting(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(StoredFileError, match="nested deeper"):
        load_toml(path, 1 << 20)


@pytest.mark.parametrize("kind", SPECIAL)
def test_bench_compare_refuses_special_files(tmp_path, kind):
    with pytest.raises(BenchError, match="special-"):
        load_results(_special(tmp_path, kind))


def test_bench_compare_cli_on_dev_zero_is_one_line_exit_2(tmp_path, capsys):
    zero = _special(tmp_path, "devzero")
    assert main(["bench", "compare", str(zero), str(zero)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a regular file" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", SPECIAL)
def test_probe_cache_at_a_special_path_is_one_line(tmp_path, kind):
    path = cache.cache_path("CPU", "A", root=tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = _special(tmp_path, kind)
    os.rename(target, path) if kind != "devzero" else path.symlink_to("/dev/zero")
    with pytest.raises(ProbeError, match="unreadable"):
        cache.load_cached("CPU", build="A", root=tmp_path)


@pytest.mark.parametrize(
    "section, field, value",
    [
        ("memory", "read_gbs", -1),
        ("memory", "read_gbs", 0),
        ("memory", "read_gbs", 1e308),
        ("memory", "read_gbs", "fast"),
        ("memory", "read_gbs", None),
        ("memory", "read_gbs", True),
        ("memory", "copy_gbs", -5.0),
        ("compute", "f32_gflops", 0),
        ("compute", "f32_gflops", "x"),
    ],
)
def test_probe_cache_with_a_figure_out_of_range_is_refused(tmp_path, section, field, value):
    path = cache.save(fake_result(build="A"), root=tmp_path)
    doc = json.loads(path.read_text())
    if doc.get(section) is None:
        pytest.skip(f"the fake result has no {section} section")
    doc[section][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ProbeError, match="damaged"):
        cache.load_cached("CPU", build="A", root=tmp_path)


def test_probe_cache_with_nan_is_refused(tmp_path):
    path = cache.save(fake_result(build="A"), root=tmp_path)
    path.write_text(path.read_text().replace('"read_gbs": ', '"read_gbs": NaN, "was": ', 1))
    with pytest.raises(ProbeError, match="unreadable"):
        cache.load_cached("CPU", build="A", root=tmp_path)


def test_probe_cache_deep_json_is_refused(tmp_path):
    path = cache.save(fake_result(build="A"), root=tmp_path)
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ProbeError, match="nested deeper"):
        cache.load_cached("CPU", build="A", root=tmp_path)


def test_chat_export_refuses_an_existing_file_without_force(tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    code = main(["chat", "--history-db", str(tmp_path / "h.db"), "--export", "1", "--out", str(notes)])
    assert code == 2 and notes.read_text() == "my notes\n"
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["missing-folder", "dir", "fifo"])
def test_chat_export_refuses_missing_folders_and_special_files(tmp_path, kind):
    out = tmp_path / "no" / "such" / "notes.md" if kind == "missing-folder" else _special(tmp_path, kind)
    args = ["chat", "--history-db", str(tmp_path / "h.db"), "--export", "1", "--out", str(out), "--force"]
    assert main(args) == 2
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("raw", ["\x1b[31mred\x1b[0m", "a\rb", "bell\x07", "two\nlines", "c1\x9b2J", "\udcff"])
def test_printable_strips_control_characters(raw):
    shown = printable(raw)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert shown.encode("utf-8")


@pytest.mark.parametrize("kind", SPECIAL)
def test_quality_text_refuses_special_files(tmp_path, kind):
    from ondevice.core.errors import QuantError
    from quant.quality import _read_text

    with pytest.raises(QuantError, match="not a regular file|cannot open"):
        _read_text(_special(tmp_path, kind))


@pytest.mark.parametrize("kind", [*SPECIAL, "deep", "not-utf8"])
def test_user_registry_damaged_or_special_is_one_line(tmp_path, kind):
    from ondevice.core.errors import RegistryError
    from ondevice.models.registry import load_registry

    user = tmp_path / "models.toml"
    if kind == "deep":
        user.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    elif kind == "not-utf8":
        user.write_bytes(b"default = '\xff'\n")
    else:
        user = _special(tmp_path, kind)
    with pytest.raises(RegistryError, match=str(user.name)):
        load_registry(user=user)


@pytest.mark.parametrize(
    "flag, value", [("--layers", "200000000"), ("--ctx-train", "99999999999"), ("--vocab", "1000000000")]
)
def test_predict_spec_numbers_are_bounded(capsys, flag, value):
    args = ["predict", "--params", "1e9", "--quant", "Q4_K_M", "--layers", "16", "--kv-heads", "8", "--head-dim", "64"]
    args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", [*SPECIAL, "deep", "list"])
def test_guard_verdict_damaged_or_special_is_checked_again(tmp_path, kind):
    from ondevice.llama import guard

    path = tmp_path / "verdict.json"
    if kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "list":
        path.write_text("[1, 2]")
    else:
        path = _special(tmp_path, kind)
    assert guard._read(path) is None
