"""The package's layers, and a checker: every import (function-level ones too) points down or
sideways within a layer, and no modules import each other in a cycle.

The layers, top to bottom (the README's Layout section says the same):

    7  cli, tui      argparse commands; the Textual app
    6  bench         suites, runner, stats, compare, reports; the quant ladder
    5  api           wiring: load() = engine + the cached predictor; predict() = model + probe
    4  probing       host and kernel probes, the probe cache, host detection
    3  engine        load, prefill, decode loop, sampling, chat, KV reuse; quality scoring
    2  roofline      pure arithmetic: spec -> bytes -> ceiling; calibration -> prediction
    1  models, gguf, llama
                     registry + default model | GGUF reader, spec, load checks, synthetic
                     models, block formats | the only code that imports llama_cpp
    0  core          errors, paths, results, metrics, formatting, file hashes, KV cache types, a file's page cache
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (layer, module prefixes): the longest matching prefix decides a module's layer
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (7, ("ondevice.cli", "ondevice.tui", "ondevice.__main__")),
    (6, ("ondevice.bench", "ondevice.quant.ladder")),
    (5, ("ondevice.api",)),
    (4, ("ondevice.probing", "ondevice.hardware", "ondevice.nameplate")),
    (3, ("ondevice.engine", "ondevice.quant.quality", "ondevice.quant.errstats")),
    (2, ("ondevice.roofline",)),
    (1, ("ondevice.registry", "ondevice.materialize", "ondevice.gguf_file", "ondevice.gguf_cursor",
         "ondevice.modelspec", "ondevice.loadcheck", "ondevice.loadcheck_asserts", "ondevice.llama", "ondevice.quant")),
    (0, ("ondevice.__init__", "ondevice.errors", "ondevice.paths", "ondevice.filelock", "ondevice.results",
         "ondevice.metrics", "ondevice.kvtypes", "ondevice.fmt", "ondevice.textclean", "ondevice.hashing", "ondevice.reasoning",
         "ondevice.pagecache")),
]
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
    if module == "ondevice":  # the package itself: its lazy attribute table is core
        module = "ondevice.__init__"
    best, layer = "", -1
    for level, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, layer = prefix, level
    if layer < 0:
        raise KeyError(f"{module} is in no layer: add it to tests/layering.py LAYERS")
    return layer


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
