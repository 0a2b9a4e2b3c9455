"""ondevice: run quantized GGUF models locally and know why they are as fast as they are.

    import ondevice
    eng = ondevice.load()                       # the default model
    g = eng.generate("The capital of France is", max_tokens=32)
    g.timings.ttft_s, g.timings.tpot_s, g.predicted_tok_s

Attributes are imported lazily: `import ondevice` loads neither llama.cpp nor numpy.

Layers, top to bottom (imports point down only; tests/test_layers.py keeps it so):
cli, tui -> bench -> api (load, predict) -> probing -> engine -> roofline (pure arithmetic)
-> models | gguf | llama (the only code that imports llama_cpp) -> core (errors, paths,
results, metrics, fmt, kvtypes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the lazy __getattr__ below resolves, spelled out so type checkers and IDEs see the names.
    from ondevice.api import load, predict
    from ondevice.core import errors
    from ondevice.core.results import Generation, Timings, TokenEvent
    from ondevice.engine import Chat, Engine
    from ondevice.gguf.spec import ModelSpec, inspect
    from ondevice.models.materialize import resolve_model
    from ondevice.probing import probe

__version__ = "0.1.0"

__all__ = [
    "load",
    "Engine",
    "Chat",
    "inspect",
    "ModelSpec",
    "probe",
    "predict",
    "Generation",
    "TokenEvent",
    "Timings",
    "resolve_model",
    "errors",
]

# public name -> module that defines it
_LAZY = {
    "load": "ondevice.api",
    "Engine": "ondevice.engine",
    "Chat": "ondevice.engine",
    "inspect": "ondevice.gguf.spec",
    "ModelSpec": "ondevice.gguf.spec",
    "probe": "ondevice.probing",
    "predict": "ondevice.api",
    "Generation": "ondevice.core.results",
    "TokenEvent": "ondevice.core.results",
    "Timings": "ondevice.core.results",
    "resolve_model": "ondevice.models.materialize",
}


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("ondevice.core.errors")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ondevice' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
