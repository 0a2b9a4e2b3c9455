"""Has this machine's speed moved since a model was timed here?

A cached timing is reused as long as its key holds (shape, machine, llama.cpp build, settings), but the machine's
own speed can move under it: a VM's host gets busier, a laptop goes on battery. Every run then misses its
prediction in one direction. So each run's decode efficiency (measured / predicted tok/s) is kept beside the timing
it was predicted from, and when the last RUNS of them all miss by more than BOUND on the same side, with no other
process busy during any of them, the timing no longer describes the machine and a re-time is due.

File: <cache_dir>/probe/timing/runs.json: {timing id: [efficiency, ...]}, the newest last, written atomically. A
timing id is a hash of the timing's figures, so a re-timed model starts a fresh list.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.core.fmt import age_text
from ondevice.core.stored import StoredFileError, load_json
from ondevice.probing.cache import probe_dir
from ondevice.roofline.timing import ShapeTiming

__all__ = ["Drift", "drift_of", "note_run", "note_predicted_run", "timing_id", "RUNS", "BOUND"]

log = logging.getLogger(__name__)

RUNS = 3  # this many runs in a row on one side make a drift
BOUND = 0.10  # ... each missing its decode prediction by more than this (the prediction's decode target)
BUSY_CORES = 0.5  # a run during which other processes used more is not kept: its own line says why it was slow
MIN_TOKENS = 16  # a run of fewer decode steps is not kept: its TPOT is a few samples
KEPT_TIMINGS = 64  # timings whose runs the file keeps (the most recently noted)
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Drift:
    """The last runs' decode efficiencies against one timing, all beyond BOUND on one side."""

    efficiencies: tuple[float, ...]  # measured / predicted decode tok/s of each run, oldest first
    timed_unix_s: float  # when the timing they were predicted from was taken

    @property
    def slower(self) -> bool:
        return self.efficiencies[0] < 1.0

    def describe(self, now_unix_s: float | None = None) -> str:
        """One line: 'the last 3 runs decoded 17-22% slower than predicted from this model's timing (5 hours ago),
        other processes quiet: this machine's speed has moved since it was timed'."""
        now = time.time() if now_unix_s is None else now_unix_s
        misses = sorted(abs(e - 1.0) * 100 for e in self.efficiencies)
        way = "slower" if self.slower else "faster"
        return (
            f"the last {len(self.efficiencies)} runs decoded {misses[0]:.0f}-{misses[-1]:.0f}% {way} than predicted "
            f"from this model's timing ({age_text(now - self.timed_unix_s)}), other processes quiet: this "
            "machine's speed has moved since it was timed"
        )


def drift_of(efficiencies: Sequence[float], timed_unix_s: float) -> Drift | None:
    """A Drift when the last RUNS efficiencies all miss by more than BOUND on the same side, else None."""
    last = tuple(efficiencies[-RUNS:])
    if len(last) < RUNS:
        return None
    if all(e < 1.0 - BOUND for e in last) or all(e > 1.0 + BOUND for e in last):
        return Drift(last, timed_unix_s)
    return None


def timing_id(timing: ShapeTiming) -> str:
    """A short hash of a timing's figures: the runs predicted from it are kept under it."""
    return hashlib.sha256(json.dumps(timing.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def note_run(timing: ShapeTiming, generation: Any, root: Path | None = None) -> Drift | None:
    """Keep a finished generation's decode efficiency under the timing it was predicted from; the Drift the kept
    runs now show, or None. A run too short to judge, or one other processes competed with, is not kept."""
    efficiency = generation.efficiency
    others = generation.other_cpu_cores or 0.0
    if efficiency is None or not math.isfinite(efficiency) or efficiency <= 0:
        return None
    if generation.timings.output_tokens < MIN_TOKENS or others > BUSY_CORES:
        return None
    path = probe_dir(root) / "timing" / "runs.json"
    runs = _load(path)
    key = timing_id(timing)
    kept = [*runs.pop(key, []), float(f"{efficiency:.4g}")][-RUNS:]
    runs[key] = kept  # re-inserted last: the oldest timings are the first dropped
    try:
        with paths.atomic_write(path, "w") as handle:
            json.dump(dict(list(runs.items())[-KEPT_TIMINGS:]), handle)
    except OSError as exc:  # a read-only cache: this run's verdict still stands, the next starts without it
        log.debug("runs not kept: %s", exc)
    return drift_of(kept, timing.created_unix_s)


def note_predicted_run(predictor: Any, generation: Any, root: Path | None = None) -> Drift | None:
    """note_run for a generation an engine's predictor predicted: kept when that predictor is one timed on this
    machine (roofline.TimedPredictor), which a re-time can move; None for any other (a bound, an estimate, none)."""
    timing = getattr(predictor, "timing", None)
    return note_run(timing, generation, root) if isinstance(timing, ShapeTiming) else None


def _load(path: Path) -> dict[str, list[float]]:
    """The kept runs; empty when there are none or the file is not one this module wrote (logged)."""
    try:
        data = load_json(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, StoredFileError, ValueError, RecursionError) as exc:
        log.warning("%s is damaged (%s): starting it afresh", path, f"{type(exc).__name__}: {exc}"[:120])
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): [float(e) for e in v if isinstance(e, (int, float)) and math.isfinite(e) and e > 0]
        for k, v in data.items()
        if isinstance(v, list)
    }
