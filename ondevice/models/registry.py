"""The model registry: models.toml (built-in) plus the user's own file.

A model reference is resolved in this order: None -> the default entry; a registry
name -> its file (materialised from its source); an existing path -> that path.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ondevice.core import paths
from ondevice.core.errors import ModelNotFoundError, RegistryError
from ondevice.core.stored import StoredFileError, load_toml

__all__ = [
    "ModelEntry",
    "Registry",
    "load_registry",
    "builtin_registry_path",
    "builtin_entries",
    "user_registry_path",
    "SOURCE_KINDS",
]

SOURCE_KINDS = ("pypi", "path", "hf_repo")
_ENTRY_KEYS = {"file", "sha256", "quant", "size_bytes", "licence", "source", "description"}
_REQUIRED_KEYS = {"file", "quant", "licence", "source"}
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ModelEntry:
    name: str  # registry key, e.g. "gemma3-270m"
    file: str  # GGUF file name
    quant: str  # quant label, e.g. "Q4_K_M"
    licence: str  # licence note
    source_kind: str  # one of SOURCE_KINDS
    source_value: str  # package name, path, or repo id
    sha256: str | None = None  # hex digest of the whole file, when known
    size_bytes: int | None = None  # file size in bytes, when known
    description: str = ""
    registry_path: Path | None = None  # the file this entry was read from

    def local_path(self) -> Path | None:
        """Where the file is (or will be, for pypi) on this machine; None if unknown."""
        if self.source_kind == "path":
            p = Path(self.source_value).expanduser()
            if not p.is_absolute() and self.registry_path is not None:
                p = self.registry_path.parent / p
            return p
        if self.source_kind == "pypi":
            return self.assembled_path()
        return _hf_cache_lookup(self.source_value, self.file)

    def assembled_path(self) -> Path:
        """Where a "pypi" source's GGUF is assembled from its package (the user's model cache)."""
        return paths.cache_dir() / "models" / self.file

    def is_present(self) -> bool:
        """True when the file can be had without any download."""
        if self.source_kind == "pypi":
            return package_available(self.source_value) or self.assembled_path().is_file()
        p = self.local_path()
        return p is not None and p.is_file()


def package_available(package: str) -> bool:
    """A "pypi" source's package is installed (its model can be had without a download): asked of the
    installed distributions' metadata, never by importing (a registry may name any package)."""
    try:
        importlib.metadata.distribution(package)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Registry:
    entries: dict[str, ModelEntry]  # name -> entry, user entries already merged over built-in
    default_name: str  # name of the default entry
    files: tuple[Path, ...]  # registry files read, built-in first
    chat_name: str | None = None  # the model `ondevice chat` uses when given none (an instruct model); None: default

    def get(self, name: str) -> ModelEntry:
        try:
            return self.entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.entries), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            known = ", ".join(sorted(self.entries))
            raise ModelNotFoundError(
                f"unknown model {name!r}: not a registry name nor an existing file{hint} (registry names: {known})"
            ) from None

    @property
    def default(self) -> ModelEntry:
        return self.get(self.default_name)

    @property
    def default_chat(self) -> ModelEntry:
        """The chat's model: an instruct model answers a question where the base default continues its text."""
        return self.get(self.chat_name or self.default_name)


def builtin_registry_path() -> Path:
    """The built-in models.toml: package data (ondevice/builtin/) in an installed wheel; in an
    editable install, the file at the checkout's top level (where the package data comes from)."""
    package = Path(__file__).resolve().parent.parent  # ondevice/
    packaged = package / "builtin" / "models.toml"
    return packaged if packaged.is_file() else package.parent / "models.toml"


def builtin_entries() -> dict[str, ModelEntry]:
    """The built-in registry's entries alone (the user's file not read)."""
    return _parse_file(builtin_registry_path(), required=True)[1]


def user_registry_path() -> Path:
    override = os.environ.get("ONDEVICE_MODELS")
    return Path(override) if override else paths.config_dir() / "models.toml"


def load_registry(builtin: Path | None = None, user: Path | None = None) -> Registry:
    """Read the built-in registry and the user's, the user's overriding by name."""
    builtin = builtin or builtin_registry_path()
    user = user or user_registry_path()
    (default_name, chat_name), entries = _parse_file(builtin, required=True)
    files = [builtin]
    if user.exists() or user.is_symlink():  # a directory, FIFO or dangling link there is refused, not ignored
        (user_default, user_chat), user_entries = _parse_file(user, required=False)
        entries.update(user_entries)
        default_name = user_default or default_name
        chat_name = user_chat or chat_name
        files.append(user)
    if default_name is None:
        raise RegistryError(f"{builtin}: no 'default' model named")
    if default_name not in entries:
        raise RegistryError(f"{files[-1]}: default model {default_name!r} has no [models.{default_name}] entry")
    if chat_name is not None and chat_name not in entries:
        raise RegistryError(f"{files[-1]}: default_chat model {chat_name!r} has no [models.{chat_name}] entry")
    return Registry(entries=entries, default_name=default_name, files=tuple(files), chat_name=chat_name)


MAX_REGISTRY_BYTES = 4 << 20  # a registry of thousands of models is well under 1 MB


def _parse_file(path: Path, required: bool) -> tuple[tuple[str | None, str | None], dict[str, ModelEntry]]:
    """(default, default_chat) names and the entries of one registry file."""
    try:
        raw = load_toml(path, MAX_REGISTRY_BYTES)
    except FileNotFoundError:
        if required:
            raise RegistryError(f"{path}: registry file not found") from None
        return (None, None), {}
    except StoredFileError as exc:
        raise RegistryError(str(exc)) from None
    unknown = set(raw) - {"default", "default_chat", "models"}
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    default, chat = raw.get("default"), raw.get("default_chat")
    for key, value in (("default", default), ("default_chat", chat)):
        if value is not None and not isinstance(value, str):
            raise RegistryError(f"{path}: key {key!r} must be a string")
    models = raw.get("models", {})
    if not isinstance(models, dict):
        raise RegistryError(f"{path}: 'models' must be a table")
    entries = {name: _parse_entry(path, name, body) for name, body in models.items()}
    return (default, chat), entries


def _parse_entry(path: Path, name: str, body: object) -> ModelEntry:
    where = f"{path}: [models.{name}]"
    if not isinstance(body, dict):
        raise RegistryError(f"{where}: must be a table")
    unknown = set(body) - _ENTRY_KEYS
    if unknown:
        raise RegistryError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    missing = _REQUIRED_KEYS - set(body)
    if missing:
        raise RegistryError(f"{where}: missing key {sorted(missing)[0]!r}")
    for key in ("file", "quant", "licence", "description"):
        if key in body and (not isinstance(body[key], str) or (key != "description" and not body[key])):
            raise RegistryError(f"{where}: key {key!r} must be a non-empty string")
    if "/" in body["file"] or "\\" in body["file"]:
        raise RegistryError(f"{where}: key 'file' must be a bare file name")
    sha = body.get("sha256")
    if sha is not None and (not isinstance(sha, str) or not _SHA256_RE.match(sha)):
        raise RegistryError(f"{where}: key 'sha256' must be 64 lowercase hex digits")
    size = body.get("size_bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise RegistryError(f"{where}: key 'size_bytes' must be a positive integer")
    kind, value = _parse_source(where, body["source"])
    return ModelEntry(
        name=name,
        file=body["file"],
        quant=body["quant"],
        licence=body["licence"],
        source_kind=kind,
        source_value=value,
        sha256=sha,
        size_bytes=size,
        description=body.get("description", ""),
        registry_path=path,
    )


def _parse_source(where: str, source: object) -> tuple[str, str]:
    if not isinstance(source, dict) or len(source) != 1:
        raise RegistryError(f"{where}: key 'source' must be a table with exactly one of {', '.join(SOURCE_KINDS)}")
    ((kind, value),) = source.items()
    if kind not in SOURCE_KINDS:
        raise RegistryError(
            f"{where}: key 'source' has unknown kind {kind!r} (expected one of {', '.join(SOURCE_KINDS)})"
        )
    if not isinstance(value, str) or not value:
        raise RegistryError(f"{where}: key 'source.{kind}' must be a non-empty string")
    return kind, value


def _hf_cache_lookup(repo: str, file: str) -> Path | None:
    """Find a file in the local Hugging Face hub cache (never downloads)."""
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    )
    snapshots = hub / ("models--" + repo.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    for snap in sorted(snapshots.iterdir(), reverse=True):
        candidate = snap / file
        if candidate.is_file():
            return candidate
    return None
