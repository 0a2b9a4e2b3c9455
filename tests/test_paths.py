"""paths: the atomic rename replaces only regular files; temp files name their writer and the
stale ones are removed; one destination check for every output the CLI writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ondevice.core import paths
from ondevice.core.errors import OndeviceError
from tests.file_fakes import SPECIAL_KINDS, age, dead_pid, file_kind, special_file, stale_temp


def _ours(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".out."))


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_atomic_write_replaces_only_a_regular_file(tmp_path, kind):
    target = special_file(tmp_path, kind)
    before = file_kind(target)
    with pytest.raises(OndeviceError, match="not a regular file"):
        with paths.atomic_write(target, "w") as f:
            f.write("results")
    with pytest.raises(OndeviceError, match="not a regular file"):
        with paths.atomic_path(target) as tmp:
            tmp.write_bytes(b"GGUF")
    assert file_kind(target) == before  # still the FIFO, socket, device, directory or link
    assert _ours(tmp_path) == []


def test_atomic_write_replaces_a_regular_file_and_a_link_to_one(tmp_path):
    target = tmp_path / "out"
    target.write_text("old")
    with paths.atomic_write(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new"
    link = tmp_path / "link"
    link.symlink_to(target)
    with paths.atomic_write(link, "w") as f:
        f.write("via link")
    assert link.read_text() == "via link" and not link.is_symlink()  # the link itself is replaced


def _killed_writer(target: Path) -> tuple[Path, int]:
    """atomic_path in a child process that dies mid-write: (the temp file it left, its pid)."""
    code = (
        "import os, sys; from pathlib import Path; from ondevice.core import paths\n"
        f"with paths.atomic_path(Path({str(target)!r})) as tmp:\n"
        "    tmp.write_bytes(b'GGUF' + bytes(4096))\n"
        "    os._exit(9)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    assert proc.wait() == 9
    left = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.")]
    assert len(left) == 1, left
    return left[0], proc.pid


def test_a_killed_writers_temp_file_names_it_and_is_removed_later(tmp_path):
    tmp, pid = _killed_writer(tmp_path / "model.gguf")
    assert f"-{pid}-" in tmp.name and paths.TEMP_TAG in tmp.name
    assert not tmp.name.endswith(".gguf")  # nothing that looks like a model
    if psutil.pid_exists(pid):
        pytest.skip("the pid was reused at once")
    assert paths.remove_stale_temps(tmp_path) == [] and tmp.exists()  # under a minute old: kept
    age(tmp, 120)
    assert paths.remove_stale_temps(tmp_path) == [tmp] and not tmp.exists()


def test_a_live_writers_temp_file_is_kept(tmp_path):
    target = tmp_path / "model.gguf"
    with paths.atomic_path(target) as tmp:
        tmp.write_bytes(b"GGUF")
        age(tmp, 3600)
        assert paths.remove_stale_temps(tmp_path) == [] and tmp.exists()  # our own pid: alive
    assert target.read_bytes() == b"GGUF" and _ours(tmp_path) == []


def test_cleanup_touches_only_our_names(tmp_path):
    stale = stale_temp(tmp_path, "a.gguf")
    others = [tmp_path / n for n in ("notes.txt", ".hidden", ".a.gguf.x1y2z3ab.tmp", f".a.gguf.tmp-{dead_pid()}-x")]
    for p in others:
        p.write_text("x")
        age(p, 7200)
    assert paths.remove_stale_temps(tmp_path, target_name="b.gguf") == [] and stale.exists()  # another target's
    assert paths.remove_stale_temps(tmp_path) == [stale]
    assert all(p.exists() for p in others)
    assert paths.remove_stale_temps(tmp_path / "missing") == []


def test_cleanup_of_an_owned_cache_folder_takes_old_style_temps_too(tmp_path):
    old = tmp_path / ".m.gguf.x1y2z3ab.tmp"  # what tempfile.mkstemp names left before temp names carried a pid
    old.write_bytes(b"GGUF")
    age(old, 600)
    assert paths.remove_stale_temps(tmp_path, owned=True) == []  # could still be an older version's live write
    age(old, 2 * 3600)
    assert paths.remove_stale_temps(tmp_path) == [] and old.exists()  # a user's folder: never
    assert paths.remove_stale_temps(tmp_path, owned=True) == [old]


# ---------- the destination check ----------


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_destination_that_is_not_a_regular_file_is_refused_even_with_force(tmp_path, kind):
    target = special_file(tmp_path, kind)
    with pytest.raises(OndeviceError, match="not a regular file"):
        paths.check_destination(target, force=True)


def test_destination_rules(tmp_path):
    from ondevice.core.errors import DestinationError

    with pytest.raises(DestinationError, match="folder .*missing does not exist"):
        paths.check_destination(tmp_path / "missing" / "r.json")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match="is not a directory"):
        paths.check_destination(tmp_path / "file" / "r.json")
    existing = tmp_path / "r.json"
    existing.write_text("keep")
    with pytest.raises(DestinationError, match="already exists; pass --force"):
        paths.check_destination(existing)
    assert paths.check_destination(existing, force=True) == existing and existing.read_text() == "keep"
    assert paths.check_destination(tmp_path / "new.json") == tmp_path / "new.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "r.json"]  # the write test left nothing


def test_read_only_destination_folder(tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits: a read-only mount
        folder = Path("/sys")
        if not folder.is_dir():
            pytest.skip("no read-only folder to try")
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o555)
    with pytest.raises(OndeviceError, match="not writable"):
        paths.check_destination(folder / "r.json")


@pytest.mark.parametrize("durable, syncs", [(True, 1), (False, 0)])
def test_atomic_path_flushes_to_disk_unless_the_file_is_scratch(tmp_path, monkeypatch, durable, syncs):
    calls = []
    monkeypatch.setattr(paths.os, "fsync", lambda fd: calls.append(fd))
    target = tmp_path / "out.bin"
    with paths.atomic_path(target, durable=durable) as tmp:
        tmp.write_bytes(b"data")
    assert target.read_bytes() == b"data" and len(calls) == syncs


def _shared_memory(tmp_path, monkeypatch) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", shm)
    return shm


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="shared memory folders are a POSIX thing")
def test_scratch_files_go_to_shared_memory_when_it_has_room(tmp_path, monkeypatch):
    shm, fallback = _shared_memory(tmp_path, monkeypatch), tmp_path / "cache"
    folder = paths.scratch_dir(fallback, 1 << 20)
    assert folder.parent == shm and folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert paths.scratch_dir(fallback, 1 << 20) == folder  # the same folder next time
    assert paths.scratch_dir(fallback, 1 << 60) == fallback  # more than it (or the RAM) holds


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="shared memory folders are a POSIX thing")
@pytest.mark.parametrize("planted", ["link", "open_to_others", "file"])
def test_a_scratch_folder_someone_else_could_have_planted_is_not_used(tmp_path, monkeypatch, planted):
    shm, fallback = _shared_memory(tmp_path, monkeypatch), tmp_path / "cache"
    target = shm / f"{paths.APP_NAME}-{os.getuid()}"
    if planted == "link":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    elif planted == "open_to_others":
        target.mkdir()
        target.chmod(0o777)
    else:
        target.write_text("x")
    assert paths.scratch_dir(fallback, 1 << 20) == fallback


def test_without_shared_memory_scratch_files_stay_in_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", tmp_path / "absent")
    assert paths.scratch_dir(tmp_path, 1) == tmp_path
