"""The package's layers, read from its folders, and a checker: every import (function-level ones
too) points down or sideways within a layer, and no modules import each other in a cycle.

A module's layer is its folder's (`ondevice/<folder>/...`, or the installed `ondevice.quant`,
`ondevice.tui`); FOLDER_LAYERS says which layer each folder is, top to bottom (docs/layout.md
draws the same):

    7  cli, tui      argparse commands; the Textual app
    6  bench         suites, runner, stats, compare, reports
    5  api           wiring: load() = engine + the predictor; predict() = model + probe
    4  probing       host probe, the model's twin timed, host detection, the probe cache
    3  engine        load, prefill, decode loop, sampling, chat, KV reuse
    2  roofline      pure arithmetic: spec -> bytes -> ceiling; measured timings -> prediction
    1  gguf, models, llama, quant
                     GGUF reader, spec, load checks | registry + default model | the only code that
                     imports llama_cpp | block formats, synthetic models and twins, quantizing
    0  core          errors, paths, results, metrics, formatting, file hashes, KV cache types

Three quant modules score or sweep models through the engine and sit higher (MODULE_LAYERS).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER_LAYERS: dict[str, int] = {
    "cli": 7,
    "tui": 7,
    "__main__": 7,
    "bench": 6,
    "api": 5,
    "probing": 4,
    "engine": 3,
    "roofline": 2,
    "gguf": 1,
    "models": 1,
    "llama": 1,
    "quant": 1,
    "core": 0,
    "__init__": 5,  # the package facade: its public names come from api and the layers below
}
# modules whose layer is not their folder's: the quality scorer and its statistics use the engine, the
# ladder sweeps quant types through the bench's measurements
MODULE_LAYERS: dict[str, int] = {"ondevice.quant.quality": 3, "ondevice.quant.errstats": 3, "ondevice.quant.ladder": 6}
# The checkout's folders and the import names they install as (pyproject.toml's package-dir).
FOLDERS = {"ondevice": "ondevice", "quant": "ondevice.quant", "tui": "ondevice.tui"}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    line: int  # line of the import in the source

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def layer_of(module: str) -> int:
    """The layer of a module of the package: MODULE_LAYERS, else its folder's (KeyError: no folder has a layer)."""
    if module in MODULE_LAYERS:
        return MODULE_LAYERS[module]
    parts = module.split(".")
    if parts[0] != "ondevice":
        raise KeyError(f"{module} is not a module of the package")
    folder = parts[1] if len(parts) > 1 else "__init__"  # the package itself: its lazy attribute table
    if folder not in FOLDER_LAYERS:
        raise KeyError(f"{module} is in no layer: put it in a folder of tests/layering.py FOLDER_LAYERS")
    return FOLDER_LAYERS[folder]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Import name -> file, for every module of the package in the checkout."""
    out = {}
    for folder, name in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([name, *parts])] = path
    return out


def import_edges(mods: dict[str, Path]) -> list[Edge]:
    """Every import of one package module by another, with its line (imports inside functions too)."""
    edges = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package):
                resolved = _resolve(target, mods)
                if resolved and resolved != name and not name.startswith(resolved + "."):
                    edges.append(Edge(name, resolved, node.lineno))
    return edges


def _targets(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names] + [base]
    return []


def _resolve(target: str, mods: dict[str, Path]) -> str | None:
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def upward_edges(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if layer_of(e.target) > layer_of(e.source)]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan's SCCs)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
