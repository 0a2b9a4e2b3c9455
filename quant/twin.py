"""PROVISIONAL (the twin builder replaces this file): a GGUF header and its shape key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ondevice.gguf.reader import ArrayRef, read_gguf

__all__ = ["Header", "read_header", "shape_key"]


@dataclass(frozen=True)
class Header:
    arch: str
    fields: dict
    tensors: tuple


def read_header(path: str | Path) -> Header:
    g = read_gguf(path)
    fields = {k: (f"array[{v.count}]" if isinstance(v, ArrayRef) else v) for k, v in g.metadata.items()}
    tensors = tuple((t.name, t.shape, t.type_name) for t in g.tensors)
    return Header(str(g.metadata.get("general.architecture")), fields, tensors)


def shape_key(header: Header) -> str:
    kv = {k: v for k, v in header.fields.items() if not k.startswith("general.") and not isinstance(v, list)}
    text = json.dumps([header.arch, sorted(kv.items(), key=lambda x: x[0]), header.tensors], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]
