"""Per-user directories, atomic file writes and their temporary files, and the check of an
output's destination.

A write goes to a temporary file beside its target, named `.NAME.ondevice-tmp-PID-RANDOM`:
hidden, never ending in the target's suffix (a killed write leaves nothing that looks like a
model), and naming the writing process, so a later run can tell a dead writer's leftovers
(`remove_stale_temps`) from a live one's. The rename only ever replaces a regular file: a
directory, device, FIFO or socket (or a link to one) at the target is a DestinationError.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import platformdirs
import psutil

from ondevice.core.errors import DestinationError

__all__ = [
    "APP_NAME",
    "TEMP_TAG",
    "cache_dir",
    "config_dir",
    "data_dir",
    "atomic_write",
    "atomic_path",
    "check_destination",
    "ensure_replaceable",
    "remove_stale_temps",
    "scratch_dir",
    "remove_left_behind",
]

APP_NAME = "ondevice"
TEMP_TAG = ".ondevice-tmp-"  # temp file = "." + target name + TEMP_TAG + writer pid + "-" + random
STALE_AFTER_S = 60.0  # a dead writer's temp file untouched this long is removed (a writer on another
# machine sharing the folder, whose pid means nothing here, touches its file while it writes)
OLD_STYLE_STALE_AFTER_S = 3600.0  # temp names from before they carried a pid: only by age, in our own folders
_NAME_CHARS = 200  # of the target name kept in a temp name (a file name has at most 255 bytes)
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.ondevice-tmp-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_OLD_STYLE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # tempfile.mkstemp(prefix=".NAME.", suffix=".tmp")
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)

log = logging.getLogger(__name__)

SHARED_MEMORY_DIR = Path("/dev/shm")  # a RAM file system where the system has one (Linux)
SCRATCH_SPARE_BYTES = 1 << 30  # RAM a scratch folder in shared memory leaves free beyond twice what it holds


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


# ---------- atomic writes ----------


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Write to a temporary file beside `path`, fsync, then rename over it.

    An exception before the rename leaves `path` untouched and the temporary file removed; a
    kill leaves a temp name that a later run removes. Raises DestinationError (an OSError)
    when `path` is something other than a regular file.
    """
    with _replacing(Path(path)) as (fd, _tmp):
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer that opens files itself; rename it
    over `path` on success, remove it on failure (DestinationError as atomic_write). durable:
    flushed to disk before the rename (False for scratch files removed within the run, which
    need not wait for the disk)."""
    with _replacing(Path(path)) as (fd, tmp):
        os.close(fd)
        yield tmp
        if durable:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[tuple[int, Path]]:
    """(fd, path) of a new temporary file beside `path`, renamed over it when the block ends
    without an exception and removed otherwise."""
    ensure_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, target_name=path.name)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path.name))
    except OSError as exc:
        raise DestinationError(f"cannot write {path}: {exc.strerror or exc}") from None
    tmp = Path(name)
    try:
        yield fd, tmp
        os.chmod(tmp, 0o644)
        ensure_replaceable(path)  # again: something else may have been put there meanwhile
        try:
            os.replace(tmp, path)
        except OSError as exc:  # an immutable file, a read-only mount: said of the destination, not the temp name
            raise DestinationError(f"cannot write {path}: {exc.strerror or exc}; nothing written there") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _temp_prefix(name: str) -> str:
    return f".{name[:_NAME_CHARS]}{TEMP_TAG}{os.getpid()}-"


def ensure_replaceable(path: Path) -> None:
    """Raise DestinationError unless `path` is absent or a regular file (a link counts as what
    it points to; the rename then replaces the link itself)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a loop of links, a path through a file, no permission
        raise DestinationError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    raise DestinationError(f"{path} is {kind}, not a regular file: refusing to replace it")


# ---------- leftovers of killed writers ----------


def remove_stale_temps(folder: Path, *, target_name: str | None = None, owned: bool = False) -> list[Path]:
    """Remove what killed writers left in `folder`: ondevice temp files (of `target_name` only,
    when given) whose writing process is gone and that nobody touched for STALE_AFTER_S.

    owned: the folder is ondevice's own (model or probe cache), so old-style temp names that
    carry no pid (`.NAME.XXXXXXXX.tmp`) untouched for OLD_STYLE_STALE_AFTER_S go too; a
    user's folder keeps every name ondevice does not write now. Returns the removed paths.
    """
    return _remove_if(folder, lambda entry, now: _is_stale(entry, target_name, owned, now))


def remove_left_behind(folder: Path, names: re.Pattern[str]) -> list[Path]:
    """Remove the files of `names` in `folder` (ondevice's own) that killed processes left (scratch files under
    names of their own, not temp names): those whose `pid` group names a process that is gone, untouched for
    STALE_AFTER_S, and those matched without a pid (an older version's names), untouched for
    OLD_STYLE_STALE_AFTER_S. Returns the removed paths."""

    def left(entry: os.DirEntry, now: float) -> bool:
        match = names.match(entry.name)
        if match is None:
            return False
        pid = match.groupdict().get("pid")
        return _gone(entry, pid, STALE_AFTER_S if pid else OLD_STYLE_STALE_AFTER_S, now)

    return _remove_if(folder, left)


def _remove_if(folder: Path, stale: Callable[[os.DirEntry, float], bool]) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no folder yet, or not ours to read
        return []
    now, removed = time.time(), []
    for entry in entries:
        if not stale(entry, now):
            continue
        try:
            os.unlink(entry.path)
        except OSError as exc:  # another cleaner got there first, or no permission: leave it
            log.debug("not removing %s: %s", entry.path, exc)
            continue
        removed.append(Path(entry.path))
    return removed


def _is_stale(entry: os.DirEntry, target_name: str | None, owned: bool, now: float) -> bool:
    match = _TEMP_NAME.match(entry.name)
    if match:
        if target_name is not None and match["target"] != target_name[:_NAME_CHARS]:
            return False
        return _gone(entry, match["pid"], STALE_AFTER_S, now)
    if owned and target_name is None and _OLD_STYLE.match(entry.name):
        return _gone(entry, None, OLD_STYLE_STALE_AFTER_S, now)
    return False


def _gone(entry: os.DirEntry, pid: str | None, limit_s: float, now: float) -> bool:
    """A regular file untouched for limit_s whose process (pid; None: by age alone) is gone."""
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or now - st.st_mtime <= limit_s:
        return False
    return pid is None or not psutil.pid_exists(int(pid))


# ---------- destinations of outputs ----------


def check_destination(path: str | Path, *, force: bool = False) -> Path:
    """Check, before any work, that an output can be written at `path`; return it as a Path.

    The one rule for every file the CLI writes: the folder must exist and take a new file
    (tried by creating one, since root passes os.access everywhere and a read-only mount or a
    full disk only shows on a real write); `path` must be absent, or a regular file when
    `force`; a directory, device, FIFO or socket (or a link to one) is refused even with
    force. Raises DestinationError.
    """
    path = Path(path)
    folder = path.parent
    if not folder.exists():
        raise DestinationError(f"destination folder {folder} does not exist")
    if not folder.is_dir():
        raise DestinationError(f"destination folder {folder} is not a directory")
    ensure_replaceable(path)
    if path.exists() and not force:
        raise DestinationError(f"{path} already exists; pass --force to overwrite it")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DestinationError(f"destination folder {folder} is not writable")
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=_temp_prefix(path.name))
    except OSError as exc:
        raise DestinationError(f"destination folder {folder} is not writable ({exc.strerror or exc})") from None
    try:
        os.write(fd, b"\0")
    except OSError as exc:
        raise DestinationError(f"cannot write in {folder} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
    return path


def scratch_dir(fallback: Path, needed_bytes: int) -> Path:
    """A folder of this user's for scratch files written and removed within one run: in shared memory (writing
    there never waits for a disk; the files' pages are the ones a reader maps) when there is one with room for
    twice needed_bytes and the RAM to spare, else `fallback`. A folder there that is not this user's own
    directory (a link, another owner) is never used."""
    uid = getattr(os, "getuid", None)
    if uid is None or not SHARED_MEMORY_DIR.is_dir() or not os.access(SHARED_MEMORY_DIR, os.W_OK):
        return fallback
    try:
        free = os.statvfs(SHARED_MEMORY_DIR)
        room = free.f_bavail * free.f_frsize
    except OSError:
        return fallback
    if min(room, psutil.virtual_memory().available - SCRATCH_SPARE_BYTES) < 2 * needed_bytes:
        return fallback
    folder = SHARED_MEMORY_DIR / f"{APP_NAME}-{uid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        st = folder.lstat()
    except OSError:
        return fallback
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid() or st.st_mode & 0o077:
        return fallback
    return folder
