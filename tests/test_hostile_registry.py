"""A user registry that lies or points at the wrong kind of thing: refused with one line, never used unchecked.

A path entry whose file disagrees with its size or sha256, ONDEVICE_MODELS at a directory or FIFO, and
a `pypi` source naming a package that must not be imported (its files are found through metadata)."""

from __future__ import annotations

import hashlib
import os

import pytest

from ondevice.cli.main import main
from ondevice.core.errors import DefaultModelError
from ondevice.models import materialize
from ondevice.models.registry import load_registry
from tests.file_fakes import special_file


def user_registry(tmp_path, monkeypatch, body: str):
    user = tmp_path / "models.toml"
    user.write_text(body)
    monkeypatch.setenv("ONDEVICE_MODELS", str(user))
    return user


def path_entry(file, *, sha256: str | None = None, size_bytes: int | None = None) -> str:
    extra = (f'sha256 = "{sha256}"\n' if sha256 else "") + (f"size_bytes = {size_bytes}\n" if size_bytes else "")
    return f'[models.mine]\nfile = "{file.name}"\nquant = "F16"\nlicence = "x"\n{extra}source = {{ path = "{file}" }}\n'


def one_line_exit_2(capsys, argv, *needles) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def model_copy(tmp_path, tiny_model):
    copy = tmp_path / "mine.gguf"
    copy.write_bytes(tiny_model.read_bytes())
    return copy


def test_a_path_entry_with_the_wrong_size_is_refused(tmp_path, monkeypatch, capsys, model_copy):
    user_registry(tmp_path, monkeypatch, path_entry(model_copy, size_bytes=model_copy.stat().st_size + 1))
    one_line_exit_2(capsys, ["info", "mine"], str(model_copy), "bytes", "refused")


def test_a_path_entry_with_the_wrong_sha256_is_refused(tmp_path, monkeypatch, capsys, model_copy):
    user_registry(tmp_path, monkeypatch, path_entry(model_copy, sha256="0" * 64))
    one_line_exit_2(capsys, ["info", "mine"], str(model_copy), "sha256", "refused")


def test_a_path_entry_is_hashed_once_and_again_when_the_file_changes(tmp_path, monkeypatch, model_copy):
    digest = hashlib.sha256(model_copy.read_bytes()).hexdigest()
    user_registry(tmp_path, monkeypatch, path_entry(model_copy, sha256=digest, size_bytes=model_copy.stat().st_size))
    entry = load_registry().get("mine")
    assert materialize.materialize(entry) == model_copy
    hashed = []
    real = materialize.sha256_file
    monkeypatch.setattr(materialize, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert materialize.materialize(entry) == model_copy and hashed == []  # recorded: not hashed again
    data = bytearray(model_copy.read_bytes())
    data[-1] ^= 0xFF  # same size, new content and mtime
    model_copy.write_bytes(bytes(data))
    os.utime(model_copy, ns=(model_copy.stat().st_atime_ns, model_copy.stat().st_mtime_ns + 10**9))
    with pytest.raises(DefaultModelError, match="the registry says"):
        materialize.materialize(entry)
    assert hashed == [model_copy]
    assert not list(model_copy.parent.glob("*.verified.json"))  # the record is in the cache, not beside the file


@pytest.mark.parametrize("kind", ["directory", "fifo", "link_to_fifo"])
def test_ondevice_models_at_a_directory_or_fifo_is_one_line(tmp_path, monkeypatch, capsys, kind):
    target = special_file(tmp_path, kind, "models.toml")
    monkeypatch.setenv("ONDEVICE_MODELS", str(target))
    one_line_exit_2(capsys, ["models"], str(target))
    one_line_exit_2(capsys, ["info", "gemma3-270m"], str(target))


@pytest.fixture
def trap_package(tmp_path, monkeypatch):
    """An installed distribution whose package, if imported, leaves a marker file (it must never be)."""
    site = tmp_path / "site"
    marker = tmp_path / "imported"
    pkg = site / "trap_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "data" / "notes.txt").write_text("no model here")
    info = site / "trap_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trap-pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("trap_pkg/__init__.py,,\ntrap_pkg/data/notes.txt,,\n")
    monkeypatch.syspath_prepend(str(site))
    return marker


def test_a_pypi_source_is_never_imported(tmp_path, monkeypatch, capsys, trap_package):
    body = '[models.trap]\nfile = "t.gguf"\nquant = "F16"\nlicence = "x"\nsource = { pypi = "trap-pkg" }\n'
    user_registry(tmp_path, monkeypatch, body)
    assert main(["models"]) == 0  # the listing asks whether the package is installed
    assert "trap" in capsys.readouterr().out
    one_line_exit_2(capsys, ["info", "trap"], "trap-pkg", "does not hold t.gguf")
    assert main(["models", "--verify"]) in (0, 1)
    capsys.readouterr()
    assert not trap_package.exists()


def test_a_pypi_source_naming_a_standard_module_is_not_imported(tmp_path, monkeypatch, capsys):
    body = '[models.x]\nfile = "x.gguf"\nquant = "F16"\nlicence = "x"\nsource = { pypi = "antigravity" }\n'
    user_registry(tmp_path, monkeypatch, body)
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda *a, **k: opened.append(a))  # what importing it would do
    one_line_exit_2(capsys, ["info", "x"], "pip install antigravity")
    assert opened == []
