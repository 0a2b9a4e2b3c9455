"""The installed distribution has one import name: every package of the checkout is listed in
pyproject.toml under `ondevice.*`, and the built-in registry ships as package data.

(.ci/run builds the wheel and runs it in a fresh virtualenv; this catches a package that was
added to the tree but not to the list, without building anything.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from ondevice.models import registry

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _import_name(folder: Path, package_dir: dict[str, str]) -> str:
    rel = folder.relative_to(ROOT)
    for name, src in package_dir.items():
        if src != "." and rel.parts[: len(Path(src).parts)] == Path(src).parts:
            return ".".join([name, *rel.parts[len(Path(src).parts) :]])
    return ".".join(rel.parts)


def test_every_package_in_the_tree_is_installed_under_ondevice():
    cfg = _setuptools()
    found = {
        _import_name(module.parent, cfg["package-dir"])
        for top in ("ondevice", "quant", "tui")
        for module in (ROOT / top).rglob("*.py")
    }
    listed = set(cfg["packages"])
    assert found - listed == set(), "packages missing from pyproject.toml [tool.setuptools] packages"
    assert all(name == "ondevice" or name.startswith("ondevice.") for name in listed)


def test_builtin_registry_is_package_data():
    cfg = _setuptools()
    src = cfg["package-dir"]["ondevice.builtin"]
    assert "models.toml" in cfg["package-data"]["ondevice.builtin"]
    assert (ROOT / src / "models.toml").is_file()


def test_builtin_registry_found_packaged_or_in_checkout(tmp_path, monkeypatch):
    # in this checkout: the top-level file
    assert registry.builtin_registry_path() == ROOT / "models.toml"
    # in an installed wheel: ondevice/builtin/models.toml beside the module
    pkg = tmp_path / "ondevice"
    (pkg / "builtin").mkdir(parents=True)
    (pkg / "builtin" / "models.toml").write_text("")
    monkeypatch.setattr(registry, "__file__", str(pkg / "models" / "registry.py"))
    assert registry.builtin_registry_path() == pkg / "builtin" / "models.toml"


HEAVY = ("numpy", "llama_cpp")
PROBE = """
import json, sys
def heavy():
    return sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
import ondevice
after_import = heavy()
ondevice.__version__, ondevice.errors, ondevice.Generation, ondevice.TokenEvent, ondevice.Timings
after_light_names = heavy()
import numpy  # the check itself sees a heavy import
print(json.dumps([after_import, after_light_names, heavy()]))
"""


def test_import_ondevice_loads_neither_numpy_nor_llama_cpp():
    """The package docstring's promise, in a fresh interpreter (this one has both loaded)."""
    proc = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}" + PROBE], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    after_import, after_light_names, control = json.loads(proc.stdout)
    assert after_import == [] and after_light_names == []
    assert control == ["numpy"]
