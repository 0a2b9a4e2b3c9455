"""What the benchmark scripts share: their common flags, the alternating A/B order, JSON output, the CPU's name."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "HF_CONFIGS",
    "add_model_arg",
    "add_threads_arg",
    "add_pairs_arg",
    "rotating_order",
    "cpu_name",
    "cpu_description",
    "print_json",
    "write_json",
    "StopCounter",
]

ROOT = Path(__file__).resolve().parents[1]
HF_CONFIGS = ROOT / "tests" / "data" / "hf_configs"


def add_model_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="registry name or GGUF path (default: the default model)")


def add_threads_arg(ap: argparse.ArgumentParser, default: int | None = None) -> None:
    ap.add_argument("--threads", type=int, default=default, help="CPU threads (default: the engine's choice)")


def add_pairs_arg(ap: argparse.ArgumentParser, default: int, help: str = "A/B pairs, order alternating") -> None:
    ap.add_argument("--pairs", type=int, default=default, help=help)


def rotating_order(round_index: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """The sides in the order round `round_index` runs them: rotated by one each round, so over len(sides) rounds
    each side runs in every place once (no side always first: warm caches, turbo clocks) and a drift of the machine
    falls on all alike. Two sides swap every other round."""
    shift = round_index % len(sides)
    return sides[shift:] + sides[:shift]


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo with its x86 family and model numbers (a VM often names only the
    vendor's line, "AMD EPYC", and the numbers tell its generation apart), else what platform knows."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _sep, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip() and fields:  # the first processor's block is enough
                break
        name = fields.get("model name")
        if name:
            family, model = fields.get("cpu family"), fields.get("model")
            return f"{name} (family {family}, model {model})" if family and model else name
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_description() -> str:
    """One line for a report's head: the CPU, its logical CPU count and the load average when it started."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; load average {load:.1f}"


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def write_json(path: Path, doc: Any) -> None:
    """Write `doc` to `path` whole or not at all (a temp file beside it, then os.replace)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StopCounter:
    """Counts the times this process was stopped and continued (SIGSTOP or Ctrl-Z, then SIGCONT): a timing that spans
    one holds the time it stood still, not the machine's speed, so a script runs that round again. Python runs the
    handler once the main thread is back in the interpreter, which is before the timed call's result is used."""

    def __init__(self) -> None:
        self.count = 0
        if hasattr(signal, "SIGCONT"):
            signal.signal(signal.SIGCONT, self._continued)

    def _continued(self, signum: int, frame: Any) -> None:
        self.count += 1
