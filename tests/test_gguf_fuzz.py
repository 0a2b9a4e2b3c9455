"""Seeded GGUF fuzzing: the header reader never fails untyped, and every mutant either is
refused before llama.cpp opens it or loads in llama.cpp (or is refused there cleanly) in a
child process. The fast run is part of the default suite; the slow one runs on a schedule:

    python -m pytest tests/test_gguf_fuzz.py -m fuzz_slow -s

(ONDEVICE_FUZZ_SEED=<int> picks another seed; -s prints the outcome counts; a crashed
mutant stays in pytest's tmp_path and its path is in the failure message.)
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from ondevice.core.errors import GGUFFormatError
from ondevice.gguf.loadcheck import inspect_for_load
from ondevice.gguf.spec import inspect
from tests.gguf_fuzz import load_in_child, mutants

REFUSED_BY_US = "refused by our checks"
OUTCOME_CLASS = {"loaded": "loaded", "llama_refused": "refused by llama.cpp cleanly", "crashed": "crashed"}


def run_fuzz(model: Path, workdir: Path, n: int, seed: int) -> tuple[Counter, list[str]]:
    """Outcome counts by class (and by kind) for n mutants, and one line per crash."""
    counts: Counter = Counter()
    to_load: list[tuple[str, Path]] = []
    for i, (kind, data) in enumerate(mutants(model, n, seed)):
        path = workdir / f"{kind}-{i}.gguf"
        path.write_bytes(data)
        try:  # `ondevice info`: a typed error or a spec whose bytes add up
            spec = inspect(path)
        except GGUFFormatError:
            counts["info refused"] += 1
        else:
            assert spec.weight_bytes + spec.header_bytes + spec.padding_bytes == spec.file_bytes, path
        try:
            inspect_for_load(path)
        except GGUFFormatError:
            counts[REFUSED_BY_US] += 1
            path.unlink()
            continue
        to_load.append((kind, path))
    crashes = []
    for j, (outcome, detail) in load_in_child([p for _, p in to_load]).items():
        kind, path = to_load[j]
        counts[OUTCOME_CLASS[outcome]] += 1
        counts[f"{OUTCOME_CLASS[outcome]} ({kind})"] += 1
        if outcome == "crashed":
            crashes.append(f"{path}: {detail}")
        else:
            path.unlink()
    counts["crashed"] += 0
    return counts, crashes


def summary(counts: Counter) -> str:
    classes = [REFUSED_BY_US, *OUTCOME_CLASS.values()]
    return ", ".join(f"{c}: {counts[c]}" for c in classes)


def check(counts: Counter, crashes: list[str], n: int) -> None:
    print(f"\n{n} mutants: {summary(counts)}")
    listed = "\n".join(crashes[:20]) + (f"\n... and {len(crashes) - 20} more" if len(crashes) > 20 else "")
    assert counts["crashed"] == 0 and not crashes, f"llama.cpp crashed on {len(crashes)} mutants:\n{listed}"
    classes = [REFUSED_BY_US, *OUTCOME_CLASS.values()]
    assert sum(counts[c] for c in classes) == n
    # the run must have exercised both sides: mutants refused by us and mutants that reached llama.cpp
    assert counts[REFUSED_BY_US] > n // 10 and counts["loaded"] > n // 20, summary(counts)
    assert counts["info refused"] > n // 10, counts


def test_fuzz_fast(tiny_model, tmp_path):
    """400 mutants, 50 of each kind: a few seconds."""
    counts, crashes = run_fuzz(tiny_model, tmp_path, 400, seed=20240613)
    check(counts, crashes, 400)


@pytest.mark.fuzz_slow
def test_fuzz_slow(tiny_model, tmp_path):
    """5000 mutants (a few minutes); ONDEVICE_FUZZ_SEED varies the seed between scheduled runs."""
    seed = int(os.environ.get("ONDEVICE_FUZZ_SEED", "7"))
    counts, crashes = run_fuzz(tiny_model, tmp_path, 5000, seed=seed)
    print(f"seed {seed}")
    check(counts, crashes, 5000)
