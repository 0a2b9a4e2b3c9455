"""Hostile output destinations (FIFOs, sockets, devices, directories) and dead writers' temp files."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

SPECIAL_KINDS = ("fifo", "socket", "chardev", "directory", "link_to_fifo")


def special_file(folder: Path, kind: str, name: str = "out") -> Path:
    """Make something at folder/name that is not a regular file (skips where this OS or user cannot)."""
    path = folder / name
    if kind in ("fifo", "link_to_fifo"):
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this OS")
        fifo = path if kind == "fifo" else folder / f"{name}.fifo"
        os.mkfifo(fifo)
        if kind == "link_to_fifo":
            path.symlink_to(fifo)
    elif kind == "socket":
        if not hasattr(socket, "AF_UNIX"):
            pytest.skip("no Unix sockets on this OS")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after close
    elif kind == "chardev":  # what /dev/full is: character device 1,7
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        except (AttributeError, PermissionError, OSError):
            pytest.skip("cannot make a device node here (needs root)")
    elif kind == "directory":
        path.mkdir()
    else:
        raise ValueError(kind)
    return path


def file_kind(path: Path) -> int:
    """stat.S_IFMT of the path itself (a symlink stays a symlink)."""
    return stat.S_IFMT(os.lstat(path).st_mode)


def dead_pid() -> int:
    """The process id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    if psutil.pid_exists(proc.pid):
        pytest.skip("the pid was reused at once")
    return proc.pid


def age(path: Path, seconds: float) -> None:
    """Set a file's modification time `seconds` into the past."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def stale_temp(folder: Path, name: str, *, pid: int | None = None, age_s: float = 120.0) -> Path:
    """A temporary file an ondevice writer (dead unless pid says otherwise) left for folder/name."""
    from ondevice.core.paths import TEMP_TAG

    path = folder / f".{name}{TEMP_TAG}{dead_pid() if pid is None else pid}-k3x9q2"
    path.write_bytes(b"GGUF" + bytes(60))
    age(path, age_s)
    return path
