"""Per-user directories and atomic file writes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

import platformdirs

APP_NAME = "ondevice"


def cache_dir() -> Path:
    """User cache dir (models, probe results). ONDEVICE_CACHE_DIR overrides it."""
    override = os.environ.get("ONDEVICE_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME))


def config_dir() -> Path:
    """User config dir (the user's models.toml)."""
    override = os.environ.get("ONDEVICE_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    """User data dir (chat history)."""
    override = os.environ.get("ONDEVICE_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Write to a temporary file beside `path`, fsync, then rename over it.

    An exception (or a kill) before the rename leaves `path` untouched and the
    temporary file removed (or, after a kill, a `.tmp` name nobody reads).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer that opens files itself;
    rename it over `path` on success, remove it on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp_name)
        with open(tmp_name, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
