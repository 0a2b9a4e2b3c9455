"""A lock between processes on one file: fcntl.flock on POSIX, msvcrt.locking on Windows.

The OS lets go of the lock when its holder exits or is killed, so a lock is never stale and
needs no clean-up. The file holds the holder's process id (for the line a waiting process
shows) and is never removed: removing it would let a third process lock a new file while a
second still holds the old one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["FileLock", "LockTimeout"]

_WINDOWS = sys.platform == "win32"
if _WINDOWS:
    import msvcrt
else:
    import fcntl

_PID_BYTES = 64  # the pid text lives before this offset; Windows locks the byte at it (a locked
# range cannot be read there, and a waiting process reads the pid)
_POLL_S = 0.2  # how often a waiting process tries again


class LockTimeout(TimeoutError):
    """The lock was still held when the wait ran out; `pid` is the holder's (None if unknown)."""

    def __init__(self, pid: int | None):
        super().__init__(f"lock held by pid {pid}")
        self.pid = pid


class FileLock:
    """An exclusive lock on `path` (created if missing). Use `with FileLock(p):` to wait for it
    without a limit, or acquire(timeout_s=..., on_wait=...) to say so and give up."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, *, timeout_s: float | None = None, on_wait: Callable[[int | None], None] | None = None) -> None:
        """Block until the lock is held. on_wait(holder pid) runs once when the lock is found
        taken; LockTimeout after timeout_s seconds (None: wait as long as it takes). OSError
        when the lock file cannot be opened."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this FileLock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            told = False
            while not _try_lock(fd):
                pid = self.holder_pid()
                if not told and on_wait is not None:
                    on_wait(pid)
                    told = True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LockTimeout(pid)
                time.sleep(_POLL_S if left is None else min(_POLL_S, left))
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:
            os.close(fd)  # closing lets go of a lock taken just before the failure too
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            _unlock(fd)
        finally:
            os.close(fd)

    def holder_pid(self) -> int | None:
        """The process id written by the holder, None if none can be read."""
        try:
            with open(self.path, "rb") as f:
                return int(f.read(_PID_BYTES).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    """True when the lock is now ours, False when another holds it (other failures raise)."""
    if _WINDOWS:
        os.lseek(fd, _PID_BYTES, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]  # msvcrt has these on Windows only
        except OSError:  # EACCES: the byte is locked by another handle
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if _WINDOWS:
        os.lseek(fd, _PID_BYTES, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]  # msvcrt has these on Windows only
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
