"""Shared by the header-builder tests: the public configs (tests/data/hf_configs) and one block's tensors."""

from __future__ import annotations

import json
from pathlib import Path

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def hf_config(name: str) -> dict:
    """A public model's config.json, by file stem ("lfm2-1.2b")."""
    return json.loads((CONFIGS / f"{name}.json").read_text())


def block_tensors(header, bid: int = 0) -> dict[str, tuple[tuple[int, ...], str]]:
    """Block bid's tensors: {name without "blk.{bid}.": (shape, type)}."""
    prefix = f"blk.{bid}."
    return {t.name.removeprefix(prefix): (t.shape, t.type) for t in header.tensors if t.name.startswith(prefix)}


def arch_fields(header) -> dict:
    """The header's fields under its architecture's prefix, by their names without it ("block_count", ...)."""
    prefix = f"{header.arch}."
    return {k.removeprefix(prefix): f for k, f in header.fields.items() if k.startswith(prefix)}
