"""Probe results cached per machine + backend + llama.cpp build, as JSON in the user cache dir.

File: <cache_dir>/probe/<backend>-<build_id>-<machine_id>.json, written atomically, so an
interrupted probe leaves no half-written file. A changed llama.cpp build (version or system
info) or backend changes the key, so the old result is simply not found.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
from pathlib import Path

import psutil

from ondevice.core import paths
from ondevice.llama.build import build_id
from ondevice.probing.result import SCHEMA_VERSION, ProbeResult

__all__ = ["cache_path", "load_cached", "save", "build_id", "machine_id", "probe_dir", "lock_path"]

log = logging.getLogger(__name__)

MAX_CACHE_BYTES = 1 << 20  # a probe result is a few KB


def probe_dir(root: Path | None = None) -> Path:
    return (root or paths.cache_dir()) / "probe"


def lock_path(root: Path | None = None) -> Path:
    """The file whose lock a measuring probe holds (see ondevice.core.filelock)."""
    return probe_dir(root) / "probe.lock"


def machine_id() -> str:
    """A short, stable fingerprint of this machine (host name, CPU, cores, RAM)."""
    parts = [
        platform.node(),
        platform.machine(),
        platform.processor(),
        str(psutil.cpu_count(logical=True)),
        str(psutil.virtual_memory().total),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def cache_path(backend: str, build: str | None = None, machine: str | None = None, root: Path | None = None) -> Path:
    name = f"{_safe(backend.lower())}-{build or build_id()}-{machine or machine_id()}.json"
    return probe_dir(root) / name


def load_cached(backend: str, *, build: str | None = None, root: Path | None = None) -> ProbeResult | None:
    """The cached result for this machine, `backend` and llama.cpp build; None if absent or written
    by another schema version (an older ondevice: measured again). A damaged file raises ProbeError
    (one line naming it and the way out): predictions from it would be wrong, and silently
    measuring again would hide the damage."""
    from ondevice.core.errors import ProbeError
    from ondevice.core.stored import StoredFileError, load_json

    path = cache_path(backend, build, root=root)
    try:
        data = load_json(path, MAX_CACHE_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, StoredFileError) as exc:
        reason = str(exc).removeprefix(f"{path}: ") if isinstance(exc, StoredFileError) else _short(exc)
        raise ProbeError(
            f"probe cache {path} is unreadable ({reason}); delete it or run `ondevice probe --refresh`"
        ) from None
    if isinstance(data, dict) and data.get("schema") != SCHEMA_VERSION and isinstance(data.get("schema"), int):
        log.info("probe cache %s has schema %s, not %s: measuring again", path, data.get("schema"), SCHEMA_VERSION)
        return None
    try:
        return ProbeResult.from_dict(data, from_cache=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProbeError(
            f"probe cache {path} is damaged ({_short(exc)}); delete it or run `ondevice probe --refresh`"
        ) from None


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


def save(result: ProbeResult, *, root: Path | None = None) -> Path:
    """Write atomically; returns the path."""
    path = cache_path(result.backend, result.build_id, root=root)
    with paths.atomic_write(path, "w") as handle:
        json.dump(result.to_dict(), handle, indent=1)
    return path


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+]+", "_", s)
