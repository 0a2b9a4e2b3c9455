"""Timings of model shapes, cached per (shape, machine, llama.cpp build, engine settings).

File: <cache_dir>/probe/timing/<key>.json, written atomically. The key hashes the model's shape (its
tensors' names, shapes and types and its hyperparameters: a twin and its model share it, a renamed
or re-downloaded file too), this machine, the llama.cpp build and the engine settings that change
speed (backend, threads, offload, micro-batch, flash attention, KV cache types, CPU buffer types).
A file that is damaged is reported and measured again; one from another schema is simply not found.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.core.stored import StoredFileError, load_json
from ondevice.llama.build import build_id
from ondevice.probing.cache import machine_id, probe_dir
from ondevice.roofline.timing import ShapeTiming

__all__ = [
    "TimingKey",
    "timing_key",
    "requested_key",
    "engine_settings",
    "load_timing",
    "save_timing",
    "timing_path",
    "SCHEMA",
]

log = logging.getLogger(__name__)
SCHEMA = 7  # 2: twins with their token embedding written; 3: their gains around one; 4: the engine's padded KV view
# recorded (ShapeTiming.kv_pad); 5: the decode after the chain paired with a sibling's short context, and the twins'
# attention settled by a third round; 6: a small twin's attention the median of several pairs of bursts; 7: every
# short chunk size timed (plans.SHORT_CHUNKS; a hybrid's chain and attention layers counted): earlier timings are
# not reused
MAX_FILE_BYTES = 1 << 20  # a timing file is a few KB; anything larger is not one
SETTINGS = (
    "backend",
    "n_threads",
    "n_gpu_layers",
    "n_ubatch",
    "flash_attn_used",
    "cache_type_k",
    "cache_type_v",
    "cpu_buffers",
)


@dataclass(frozen=True)
class TimingKey:
    shape: str  # the model's shape key (quant.twin.shape_key)
    machine: str  # probing.cache.machine_id()
    build: str  # llama.cpp build id
    settings: tuple[tuple[str, Any], ...]  # engine settings that change speed (SETTINGS)

    @property
    def digest(self) -> str:
        text = json.dumps([self.shape, self.machine, self.build, list(self.settings)], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def engine_settings(info: Any) -> tuple[tuple[str, Any], ...]:
    """The settings of an engine (EngineInfo) that change its speed, in SETTINGS order."""
    return tuple((name, getattr(info, name, None)) for name in SETTINGS)


def timing_key(shape: str, info: Any) -> TimingKey:
    return TimingKey(shape=shape, machine=machine_id(), build=build_id(), settings=engine_settings(info))


def requested_key(shape: str, engine_args: dict[str, Any]) -> TimingKey:
    """The key of a model timed on twins for engine arguments as asked (before any engine resolves them): a
    `predict --config` asked again finds its timing without writing a twin."""
    from ondevice.llama.devices import default_backend, default_threads
    from ondevice.llama.guard import cpu_buffer_verdict

    asked = {
        "backend": default_backend(),
        "n_threads": default_threads(),
        "n_gpu_layers": "auto",
        "n_ubatch": None,
        "flash_attn": "auto",
        "cache_type_k": "f16",
        "cache_type_v": "f16",
        "cpu_buffers": cpu_buffer_verdict().mode,
    }
    asked.update({k: v for k, v in engine_args.items() if k in asked and v is not None})
    return TimingKey(
        shape=shape, machine=machine_id(), build=build_id(), settings=(("asked", True), *sorted(asked.items()))
    )


def timing_path(key: TimingKey, root: Path | None = None) -> Path:
    return probe_dir(root) / "timing" / f"{key.digest}.json"


def load_timing(key: TimingKey, root: Path | None = None) -> ShapeTiming | None:
    """The cached timing for key; None when there is none, or it is damaged (logged: it is measured again)."""
    path = timing_path(key, root)
    try:
        data = load_json(path, MAX_FILE_BYTES)  # regular files only, bounded in size and nesting
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            return None
        return ShapeTiming.from_dict(data["timing"])
    except FileNotFoundError:
        return None
    except (OSError, StoredFileError, ValueError, TypeError, KeyError, RecursionError) as exc:
        log.warning("timing cache %s is damaged (%s): measuring again", path, f"{type(exc).__name__}: {exc}"[:120])
        return None


def save_timing(key: TimingKey, timing: ShapeTiming, root: Path | None = None) -> Path:
    path = timing_path(key, root)
    doc = {
        "schema": SCHEMA,
        "key": {"shape": key.shape, "machine": key.machine, "build": key.build, "settings": dict(key.settings)},
        "timing": timing.to_dict(),
    }
    if not all(math.isfinite(t) for *_p, t in timing.decode + timing.prefill + timing.batch):
        raise ValueError("a timing to store must be finite")
    with paths.atomic_write(path, "w") as handle:
        json.dump(doc, handle, indent=1)
    return path
