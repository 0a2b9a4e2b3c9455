"""Imports point down the layers (tests/layering.py draws them) and form no cycle; the checker
itself catches a planted cycle and a planted upward import."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layering import Edge, cycles, import_edges, layer_of, modules, upward_edges


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(modules())


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)  # KeyError names a module nobody placed


def test_no_import_points_up(edges):
    up = sorted({str(e) for e in upward_edges(edges)})
    assert up == [], "imports that point up a layer:\n" + "\n".join(up)


def test_no_import_cycle(edges):
    assert cycles(edges) == []


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root)


def test_the_checker_catches_a_planted_cycle_and_an_upward_import(tmp_path):
    mods = _tree(
        tmp_path,
        {
            "ondevice/__init__.py": "",
            "ondevice/core/__init__.py": "",
            "ondevice/core/errors.py": "",
            "ondevice/core/paths.py": "from ondevice.core import errors\n",
            "ondevice/engine/__init__.py": "",
            "ondevice/engine/a.py": "def f():\n    from ondevice.engine import b  # inside a function: still an edge\n",
            "ondevice/engine/b.py": "from ondevice.engine.a import f\n",
            "ondevice/core/fmt.py": "from ondevice.bench import report\n",  # core reaching up to bench
            "ondevice/bench/__init__.py": "",
            "ondevice/bench/report.py": "from ..core import fmt\n",  # relative import, resolved
        },
    )
    edges = import_edges(mods)
    assert ["ondevice.engine.a", "ondevice.engine.b"] in cycles(edges)
    assert ["ondevice.bench.report", "ondevice.core.fmt"] in cycles(edges)
    up = upward_edges(edges)
    assert sorted(str(e) for e in up) == [
        "ondevice.core.fmt -> ondevice.bench (line 1)",  # the package's __init__ runs too
        "ondevice.core.fmt -> ondevice.bench.report (line 1)",
    ]


def test_a_module_outside_every_layer_is_named():
    with pytest.raises(KeyError, match="ondevice.misc.helpers is in no layer"):
        layer_of("ondevice.misc.helpers")


def test_layers_come_from_folders():
    assert layer_of("ondevice.core.errors") == 0
    assert layer_of("ondevice.gguf.spec") == layer_of("ondevice.llama.model") == 1
    assert layer_of("ondevice.cli.main") == 7
    assert layer_of("ondevice.quant.quality") == 3  # an exception MODULE_LAYERS names
