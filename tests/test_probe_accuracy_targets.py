"""benchmarks/probe_accuracy.py's verdict: the targets issue 15 set (decode within +-10% in at least
9 of 10 rows, every TTFT row within +-15%, every ceiling at or above its row's fastest round)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def accuracy():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_accuracy.py"
    spec = importlib.util.spec_from_file_location("probe_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(decode_errors, ttft_errors=(0.05,), ceiling_ok=True):
    rows = [{"model": f"m{i}", "ctx": 128, "error": e, "ceiling_ok": ceiling_ok, "ceiling_tok_s": 100.0,
             "best_tok_s": 90.0} for i, e in enumerate(decode_errors)]
    ttft = [{"model": "m", "prompt": 128, "error": e} for e in ttft_errors]
    return {"decode": {"rows": rows, "ttft_rows": ttft}}


def test_nine_of_ten_decode_rows_meet_the_target(accuracy):
    assert accuracy.misses(_report([0.02] * 9 + [0.17])) == []
    two_out = accuracy.misses(_report([0.02] * 8 + [0.17, -0.12]))
    assert any("8 of 10" in m for m in two_out) and sum("outside +-10%" in m for m in two_out) == 2


def test_an_unmeasured_row_counts_as_outside(accuracy):
    assert accuracy.misses(_report([0.02] * 9 + [float("nan")])) == []
    assert accuracy.misses(_report([0.02] * 8 + [float("nan")] * 2))


def test_every_ttft_row_and_every_ceiling_must_hold(accuracy):
    assert accuracy.misses(_report([0.0] * 10, ttft_errors=(0.05, 0.16)))
    assert accuracy.misses(_report([0.0] * 10, ceiling_ok=False))
