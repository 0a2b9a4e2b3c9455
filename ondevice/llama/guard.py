"""The crash guard: which extra CPU buffer types this machine can use with this llama.cpp build.

llama.cpp's native kernels can fault on some CPUs (AMX tile instructions under some
hypervisors: a general protection fault on the first matrix product). A fault cannot be caught
in-process, so each new (machine, llama.cpp build) pair is checked once in a child process
(`ondevice.llama.selftest`): tiny Q4_0, Q8_0 and Q4_K models loaded the normal way, a prefill
and a few decode steps, first with every extra buffer type ("all"), then, if the child died by
a signal, with CPU_REPACK only, then with none. The verdict is stored in the user cache, keyed
by CPU and build; a new build, a new CPU or an unreadable file means checking again.

ONDEVICE_CPU_BUFFERS = auto | all | repack | none overrides the verdict (auto: use it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ondevice.core import paths
from ondevice.core.stored import StoredFileError, load_json
from ondevice.llama.buffers import MODES, REPACK, extra_buffer_types
from ondevice.llama.build import build_id, build_info

__all__ = [
    "ENV_VAR",
    "Verdict",
    "CheckOutcome",
    "cpu_buffer_verdict",
    "run_check",
    "run_child",
    "verdict_path",
    "forget_verdict",
]

ENV_VAR = "ONDEVICE_CPU_BUFFERS"
SCHEMA = 2  # verdict file format; another number means check again (2: the child runs CPU-only on GPU builds)
CHECK_TIMEOUT_S = 30.0  # one child's budget (a normal check takes a few seconds); a hang is stored, not retried
# Signals sent from outside (the OOM killer's SIGKILL, a user's Ctrl-C or kill): the check is inconclusive,
# not a native crash, so nothing is turned off for good because of them.
_OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", signal.SIGTERM)})
_log = logging.getLogger("ondevice.llama")
_memo: dict[str, Verdict] = {}  # "<verdict file>|<setting>" -> this process's verdict: read or checked once


@dataclass(frozen=True)
class Verdict:
    """How loads place weights on this machine, and why."""

    mode: str  # "all" | "repack" | "none" (ondevice.llama.buffers), or "unusable": every check crashed
    source: str  # "self-test" (checked now), "cache" (checked before), "forced" (ONDEVICE_CPU_BUFFERS)
    reason: str  # what the checks found, e.g. "all: crashed (SIGSEGV); repack: ok"
    note: str | None = None  # one line for the user: something was just turned off, or a setting not honoured

    @property
    def label(self) -> str:
        """What `probe`, `info` and bench records show, e.g. "repack (self-test: all crashed (SIGSEGV); repack ok)"."""
        return f"{self.mode} ({self.source}: {self.reason})"


@dataclass(frozen=True)
class CheckOutcome:
    """One child run of the self-test."""

    ok: bool  # exited 0
    crashed: bool  # died by a signal (or a Windows crash status)
    detail: str  # "ok", "crashed (SIGSEGV)", "timed out after 30 s", "failed: <last line>"
    hung: bool = False  # ran past its timeout: stored (so later commands do not wait again), unlike other failures


Check = Callable[[str, Path], CheckOutcome]


def verdict_path(root: Path | None = None) -> Path:
    """The verdict file for this CPU and llama.cpp build."""
    version, system_info = build_info()
    key = hashlib.sha256(f"{_cpu_fingerprint()}|{build_id(version, system_info)}".encode()).hexdigest()[:16]
    return (root or paths.cache_dir()) / "native" / f"cpu-buffers-{key}.json"


def forget_verdict(root: Path | None = None) -> None:
    """Drop the stored verdict (the next load checks again)."""
    path = verdict_path(root)
    for key in [k for k in _memo if k.startswith(f"{path}|")]:
        del _memo[key]
    path.unlink(missing_ok=True)


def cpu_buffer_verdict(
    *, root: Path | None = None, check: Check | None = None, available: Sequence[str] | None = None
) -> Verdict:
    """The placement loads use here: forced by ONDEVICE_CPU_BUFFERS, else the stored verdict, else
    checked now in child processes (a few seconds, once per CPU and build) and stored. A verdict
    that turns something off, or a setting that cannot be honoured, is logged once per process."""
    path = verdict_path(root)
    memo_key = f"{path}|{os.environ.get(ENV_VAR, '')}"
    if memo_key in _memo:
        return _memo[memo_key]
    available = list(extra_buffer_types()) if available is None else list(available)
    forced, bad_setting = _setting()
    if forced is not None:
        verdict = _forced(forced, available)
    else:
        stored = _read(path)
        if stored is None:
            stored = _check_all(available, check or run_check)
            if stored.source == "self-test":
                _write(path, stored)
        verdict = _with_note(stored, bad_setting)
    if verdict.note:
        _log.warning("%s", verdict.note)
    _memo[memo_key] = verdict
    return verdict


def _setting() -> tuple[str | None, str | None]:
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in ("", "auto"):
        return None, None
    if raw in MODES:
        return raw, None
    return None, f"{ENV_VAR}={raw!r} is not one of auto, {', '.join(MODES)}; using the self-test's verdict"


def _forced(mode: str, available: list[str]) -> Verdict:
    if mode == "repack" and REPACK not in available:
        note = f"{ENV_VAR}=repack: this llama.cpp build has no {REPACK} buffer type; loading with plain CPU buffers"
        return Verdict("none", "forced", f"{REPACK} not in this build", note)
    return Verdict(mode, "forced", f"{ENV_VAR}={mode}")


def _with_note(verdict: Verdict, note: str | None) -> Verdict:
    if note is None:
        return verdict
    return Verdict(verdict.mode, verdict.source, verdict.reason, "; ".join(n for n in (note, verdict.note) if n))


def _check_all(available: list[str], check: Check) -> Verdict:
    """Try all, then repack (when the build has it), then none; the first that runs wins."""
    tried: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ondevice-selftest-") as work:
        for mode in ("all", "repack", "none"):
            if mode == "repack" and REPACK not in available:
                continue
            outcome = check(mode, Path(work))
            tried.append(f"{mode}: {outcome.detail}")
            reason = "; ".join(tried)
            if outcome.ok:
                return Verdict(mode, "self-test", reason, _turned_off_note(mode, available, outcome, tried))
            if outcome.hung:  # stored with plain buffers, so no later command waits for the timeout again
                note = (
                    f"llama.cpp's native self-test hung ({outcome.detail}); loading without extra CPU buffer "
                    f"types ({ENV_VAR}=all forces them; `probe --refresh` tries again)"
                )
                return Verdict("none", "self-test", reason, note)
            if not outcome.crashed:  # a failure of the check itself, or killed from outside: fallback, not stored
                note = (
                    f"llama.cpp's native self-test did not pass ({outcome.detail}); loading without extra "
                    f"CPU buffer types this time ({ENV_VAR}=all forces them)"
                )
                return Verdict("none", "fallback", reason, note)
    note = (
        f"llama.cpp crashed in its self-test on this machine even with plain CPU buffers ({reason}); "
        f"this build does not run here: rebuild llama-cpp-python, or set {ENV_VAR}=none to try anyway"
    )
    return Verdict("unusable", "self-test", "; ".join(tried), note)


def _turned_off_note(mode: str, available: list[str], outcome: CheckOutcome, tried: list[str]) -> str | None:
    if mode == "all":
        return None
    off = [b for b in available if mode == "none" or b != REPACK] or ["extra buffer types"]
    kept = f"; {REPACK} kept" if mode == "repack" else ""
    return (
        f"{', '.join(off)} turned off: llama.cpp crashed with {'them' if len(off) > 1 else 'it'} in a self-test "
        f"on this machine ({tried[0]}){kept}; {ENV_VAR}=all forces {'them' if len(off) > 1 else 'it'}"
    )


def run_check(
    mode: str, work: Path, *, argv: Sequence[str] | None = None, timeout_s: float = CHECK_TIMEOUT_S
) -> CheckOutcome:
    """Run the self-test child for `mode` in folder `work` (models are built there once)."""
    argv = (
        list(argv)
        if argv is not None
        else [sys.executable, "-X", "faulthandler", "-m", "ondevice.llama.selftest", mode, str(work)]
    )
    return run_child(argv, timeout_s=timeout_s)


def run_child(argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None) -> CheckOutcome:
    """Run a child that exercises llama.cpp's native code (the self-test, the first open of a file):
    exit 0 is ok; death by a signal from inside is a crash (named, with the frame faulthandler saw);
    a signal from outside (the OOM killer, Ctrl-C) or a failure without a signal is not; a run past
    `timeout_s` is killed and marked hung."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return CheckOutcome(False, False, f"timed out after {timeout_s:.0f} s", hung=True)
    except OSError as exc:
        return CheckOutcome(False, False, f"could not start ({exc.strerror or exc})")
    if proc.returncode == 0:
        return CheckOutcome(True, False, "ok")
    if proc.returncode < 0 and -proc.returncode in _OUTSIDE_SIGNALS:
        name = signal.Signals(-proc.returncode).name
        return CheckOutcome(False, False, f"killed from outside ({name}; out of memory?), inconclusive")
    crash = _crash_name(proc.returncode)
    stderr = (proc.stderr or b"").decode("utf-8", "replace")
    if crash:
        site = _crash_site(stderr)
        return CheckOutcome(False, True, f"crashed ({crash})" + (f" in {site}" if site else ""))
    tail = (stderr or (proc.stdout or b"").decode("utf-8", "replace")).strip().splitlines()
    return CheckOutcome(False, False, f"failed (exit {proc.returncode}: {tail[-1][:200] if tail else 'no output'})")


# faulthandler's dump of the crashing thread, innermost frame first: '  File "/x/selftest.py", line 46 in run_model'
_FAULT_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


def _crash_site(stderr: str) -> str | None:
    """Where the child died, from faulthandler's traceback: "run_model (selftest.py:46)"; None without one."""
    m = _FAULT_FRAME.search(stderr)
    return f"{m.group(3)} ({Path(m.group(1)).name}:{m.group(2)})" if m else None


def _crash_name(returncode: int) -> str | None:
    if returncode < 0:  # POSIX: killed by signal -returncode
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode >= 0xC0000000:  # Windows: an NTSTATUS exception code (access violation, illegal instruction)
        return f"status 0x{returncode:08X}"
    return None


def _cpu_fingerprint() -> str:
    """CPU model and feature flags: what decides which native kernels can run."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        wanted = [
            line for line in text.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))
        ]
        seen = list(dict.fromkeys(wanted))
        if seen:
            return "|".join(seen)
    except OSError:
        pass
    return f"{platform.system()}|{platform.machine()}|{platform.processor()}"


def _read(path: Path) -> Verdict | None:
    try:
        data = load_json(path, 64 << 10)  # regular files only, bounded: a verdict is a few hundred bytes
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("mode") not in (*MODES, "unusable"):
            raise ValueError("unknown schema or mode")
        return Verdict(data["mode"], "cache", str(data["reason"]))
    except FileNotFoundError:
        return None
    except (OSError, StoredFileError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.info("native check: ignoring unreadable verdict %s (%s); checking again", path, exc)
        return None


def _write(path: Path, verdict: Verdict) -> None:
    record = {
        "schema": SCHEMA,
        **{k: v for k, v in asdict(verdict).items() if k in ("mode", "reason")},
        "cpu": _cpu_fingerprint()[:200],
        "build": build_id(),
    }
    try:
        with paths.atomic_write(path, "w") as handle:
            json.dump(record, handle, indent=1)
    except OSError as exc:  # a read-only cache: the verdict holds for this process, checked again next time
        _log.info("native check: could not store the verdict in %s (%s)", path, exc)
