"""benchmarks/prediction_accuracy.py --replay: a stored run's rows predicted again from their stored timings."""

from __future__ import annotations

import pytest

from benchmarks.prediction_accuracy import OUTPUT, replay
from ondevice.gguf.spec import inspect
from ondevice.roofline import Calibration, TimedPredictor
from tests.probe_fakes import TRUTH, fake_timing


def _row(path, timing, prompt: int, ttft_s: float, tpot_s: float) -> dict:
    stale = {"predicted_ttft_s": 1.0, "predicted_tpot_s": 1.0}  # what an older arithmetic said: replaced
    measured = {"ttft_s": ttft_s, "tpot_s": tpot_s, "timing_s": 3.0, "chunk": 512, "timing": timing.to_dict()}
    return {"model": "tiny Q8_0", "file": str(path), "prompt": prompt, "twin": "whole", "rounds": [stale | measured]}


def test_each_round_is_predicted_again_from_its_own_timing(tiny_model):
    spec = inspect(tiny_model)
    slow = fake_timing(spec, dict(TRUTH, a=2 * TRUTH["a"]), batch=())
    fast = fake_timing(spec, batch=())
    row = _row(tiny_model, fast, 1024, ttft_s=2.0, tpot_s=0.02)
    row["rounds"].append(_row(tiny_model, slow, 1024, ttft_s=2.0, tpot_s=0.02)["rounds"][0])
    [again] = replay([row])
    for got, timing in zip(again["rounds"], (fast, slow)):
        pred = TimedPredictor(spec, Calibration("CPU", ceiling_gbs=1e3), timing)
        assert got["predicted_ttft_s"] == pytest.approx(pred.ttft_s(1024, 0, 512))
        assert got["predicted_tpot_s"] == pytest.approx(pred.decode_s(1024, OUTPUT) / (OUTPUT - 1))
        assert got["ttft_s"] == 2.0 and got["tpot_s"] == 0.02  # the measurements stay as stored
    errors = sorted(0.02 / r["predicted_tpot_s"] - 1 for r in again["rounds"])
    assert again["decode_error"] == pytest.approx(sum(errors) / 2)  # the median of two rounds
    assert again["meets"] == (abs(again["decode_error"]) <= 0.10 and abs(again["ttft_error"]) <= 0.15)


def test_a_run_stored_without_timings_is_refused_in_one_line(tiny_model):
    row = _row(tiny_model, fake_timing(inspect(tiny_model)), 128, ttft_s=0.1, tpot_s=0.02)
    del row["rounds"][0]["timing"]
    with pytest.raises(SystemExit, match="stored no file or timings"):
        replay([row])
