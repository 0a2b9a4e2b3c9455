"""The first open of a GGUF file on this machine: vocab-only, in a child process.

llama.cpp asserts (GGML_ASSERT, an uncaught C++ exception: SIGABRT) on some malformed files
instead of refusing them, and an abort cannot be caught in-process. The load checks
(ondevice.gguf.loadcheck) refuse what is known; for the rest, a file this machine has not opened
before is first opened vocab-only (architecture, hyperparameters, vocabulary; no weights: a
fraction of a second) in a child (`ondevice.llama.vocabcheck`, run the way the crash guard runs its
self-test). A child killed by a signal from inside makes the load a ModelLoadError, one line.

The verdict is stored in the user cache, keyed by the identity (resolved path, size, mtime, inode)
of each of the model's files (a split model has several) and the llama.cpp build: a file that
changes, or a new build, is checked again.
Built-in registry models whose sha256 this machine has checked are not checked. A file written
from a header (a twin, probing.twins) is keyed by what its caller says it depends on instead:
its header's shape, checked once whatever file it is written to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ondevice.core import paths
from ondevice.core.errors import ModelLoadError
from ondevice.core.stored import StoredFileError, load_json
from ondevice.gguf.reader import model_files
from ondevice.llama.build import build_id
from ondevice.llama.guard import CheckOutcome, run_child

__all__ = ["OpenVerdict", "check_first_open", "identity_verdict_file", "verdict_file"]

SCHEMA = 1  # verdict file format; another number means check again
OPEN_TIMEOUT_S = 60.0  # a vocab-only open takes well under a second; a hang is stored so no command waits again
_log = logging.getLogger("ondevice.llama")
_memo: dict[str, OpenVerdict] = {}  # verdict file -> this process's verdict

Opener = Callable[[Path], CheckOutcome]


@dataclass(frozen=True)
class OpenVerdict:
    """What opening one file vocab-only in a child found."""

    crashed: bool  # the child died by a signal: llama.cpp aborts on this file
    detail: str  # "ok", "crashed (SIGABRT) in open_vocab_only (vocabcheck.py:33)", "timed out after 60 s", ...


def verdict_file(path: Path, root: Path | None = None) -> Path | None:
    """Where the verdict for the model at `path`, as its files are now (a split model's every file: what llama.cpp
    opens), is stored; None when `path` cannot be stat'ed."""
    files = model_files(path)
    try:
        parts = [_file_identity(files[0])]
    except OSError:
        return None
    for other in files[1:]:  # a sibling missing now is part of the identity: its arrival changes the verdict
        try:
            parts.append(_file_identity(other))
        except OSError:
            parts.append(f"{other.name}|missing")
    identity = "|".join(parts + [build_id()])
    key = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return (root or paths.cache_dir()) / "native" / "first-open" / f"{key}.json"


def _file_identity(path: Path) -> str:
    st = os.stat(path)
    return f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}"


def identity_verdict_file(identity: str, root: Path | None = None) -> Path:
    """Where the verdict for files that all depend on `identity` (e.g. one header's shape) is stored."""
    key = hashlib.sha256(f"identity|{identity}|{build_id()}".encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return (root or paths.cache_dir()) / "native" / "first-open" / f"{key}.json"


def check_first_open(
    path: Path, *, root: Path | None = None, opener: Opener | None = None, identity: str | None = None
) -> OpenVerdict | None:
    """Raise ModelLoadError when llama.cpp aborts opening `path` (checked once per file and build,
    in a child); the verdict, or None when no check was needed (a verified built-in model).
    identity: what the file's verdict depends on when it is not the file itself (a twin written from
    a header: its shape); the verdict is stored under that, and holds for `path` for the rest of
    this process (its load checks nothing again)."""
    own_store = verdict_file(path, root)
    if own_store is None:
        return None  # the load itself says what is wrong with the path
    store = own_store if identity is None else identity_verdict_file(identity, root)
    verdict = _memo.get(str(store)) or _read(store)
    if verdict is None:
        if _verified_builtin(path):
            return None
        verdict = _open_in_child(path, opener or open_vocab_only_in_child)
        if verdict is not None:
            _write(store, path, verdict)
    if verdict is None:
        return None
    _memo[str(store)] = _memo[str(own_store)] = verdict
    if verdict.crashed:
        raise ModelLoadError(
            f"{path}: llama.cpp aborts while opening this file ({verdict.detail}, in a vocab-only check run "
            "in a child process); not loaded"
        )
    return verdict


def open_vocab_only_in_child(path: Path) -> CheckOutcome:
    """The child: `python -m ondevice.llama.vocabcheck PATH`, without ggml's gdb backtrace on abort (slow)."""
    argv = [sys.executable, "-X", "faulthandler", "-m", "ondevice.llama.vocabcheck", str(path)]
    return run_child(argv, timeout_s=OPEN_TIMEOUT_S, env={**os.environ, "GGML_NO_BACKTRACE": "1"})


def _open_in_child(path: Path, opener: Opener) -> OpenVerdict | None:
    """The verdict to store; None when the check said nothing about the file (not stored: checked again)."""
    outcome = opener(path)
    if outcome.ok or outcome.crashed:
        return OpenVerdict(outcome.crashed, outcome.detail)
    if outcome.hung:  # stored as passed, so no later command waits for the timeout again
        _log.warning("llama.cpp's vocab-only open of %s %s; loading it without the check", path, outcome.detail)
        return OpenVerdict(False, outcome.detail)
    # refused by llama.cpp (the load says why), killed from outside, or the child could not start
    _log.info("first-open check of %s inconclusive (%s); loading it without the check", path, outcome.detail)
    return None


def _verified_builtin(path: Path) -> bool:
    from ondevice.models.materialize import verified_builtin

    try:
        return verified_builtin(path)
    except Exception:  # a damaged built-in registry is said by the commands that read it; here: just check
        return False


def _read(store: Path) -> OpenVerdict | None:
    try:
        data = load_json(store, 16 << 10)  # regular files only, bounded: a verdict is a few hundred bytes
    except FileNotFoundError:
        return None
    except (OSError, StoredFileError) as exc:
        _log.info("first-open check: ignoring unreadable verdict %s (%s); checking again", store, exc)
        return None
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or not isinstance(data.get("crashed"), bool)
        or not isinstance(data.get("detail"), str)
    ):
        _log.info("first-open check: ignoring verdict %s of another form; checking again", store)
        return None
    return OpenVerdict(data["crashed"], data["detail"][:300])


def _write(store: Path, path: Path, verdict: OpenVerdict) -> None:
    record = {"schema": SCHEMA, "crashed": verdict.crashed, "detail": verdict.detail, "path": str(path)}
    try:
        with paths.atomic_write(store, "w") as handle:
            json.dump(record, handle, indent=1)
    except OSError as exc:  # a read-only cache: the verdict holds for this process, checked again next time
        _log.info("first-open check: could not store the verdict in %s (%s)", store, exc)
