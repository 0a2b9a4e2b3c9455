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


def test_prompt_lengths_are_those_the_trained_context_and_the_model_size_allow(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import ondevice.gguf.spec
    from benchmarks.prediction_accuracy import LONG_PROMPT_BYTES, prompts_for

    def spec(n_ctx_train: int, weight_bytes: int):
        monkeypatch.setattr(
            ondevice.gguf.spec,
            "inspect",
            lambda _p: SimpleNamespace(n_ctx_train=n_ctx_train, weight_bytes=weight_bytes),
        )

    asked = (128, 1024, 4096, 8192, 16384)
    spec(32768, 10**8)
    assert prompts_for(tmp_path / "m.gguf", asked) == asked
    spec(8192, 10**8)  # 8,192 and its output do not fit a trained context of 8,192
    assert prompts_for(tmp_path / "m.gguf", asked) == (128, 1024, 4096)
    spec(32768, LONG_PROMPT_BYTES + 1)  # a large model: minutes a prompt past 1,024
    assert prompts_for(tmp_path / "m.gguf", asked) == (128, 1024)
    spec(0, 10**8)  # no trained context in the file: 4,096
    assert prompts_for(tmp_path / "m.gguf", asked) == (128, 1024)


@pytest.mark.parametrize("text", ["", "128,x", "0,128", "-5"])
def test_prompt_lengths_that_are_not_positive_counts_are_refused(text):
    from benchmarks.prediction_accuracy import main

    with pytest.raises(SystemExit) as exc:
        main(["--prompts", text])
    assert exc.value.code == 2


def test_a_model_no_prompt_length_fits_is_left_out_untimed(monkeypatch, tmp_path):
    import benchmarks.prediction_accuracy as pa

    monkeypatch.setattr(pa, "prompts_for", lambda _path, _prompts: ())
    monkeypatch.setattr(pa, "predicted", lambda *_a: pytest.fail("timed a model it measures at no prompt"))
    assert pa.run([("short-context model", tmp_path / "m.gguf")], 1, tmp_path, prompts=(8192,)) == []
