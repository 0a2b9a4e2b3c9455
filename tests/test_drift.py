"""A cached timing that no longer describes the machine: the last runs all miss their prediction one way, that is
said (with how to re-time), and `--retime` times the model again."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from ondevice.cli.main import main
from ondevice.probing import drift
from ondevice.probing.drift import Drift, drift_of, note_run, timing_id
from ondevice.roofline.timing import ShapeTiming

HOUR = 3600.0


def a_timing(step_s: float = 0.01, created: float = 1000.0) -> ShapeTiming:
    return ShapeTiming(decode=((16, step_s), (512, step_s * 1.1)), prefill=((0, 16, 0.05),), created_unix_s=created)


def a_run(efficiency: float | None, tokens: int = 64, others: float = 0.0):
    """What note_run reads of a finished generation."""
    return SimpleNamespace(efficiency=efficiency, other_cpu_cores=others, timings=SimpleNamespace(output_tokens=tokens))


@pytest.mark.parametrize(
    ("efficiencies", "slower"),
    [((0.8, 0.85, 0.7), True), ((1.2, 1.15, 1.3), False), ((1.0, 0.8, 0.85, 0.7), True)],
)
def test_the_last_runs_all_beyond_the_bound_on_one_side_are_a_drift(efficiencies, slower):
    found = drift_of(efficiencies, timed_unix_s=0.0)
    assert found is not None and found.slower is slower and len(found.efficiencies) == drift.RUNS


@pytest.mark.parametrize(
    "efficiencies",
    [(0.8, 0.8), (0.8, 0.95, 0.8), (0.8, 1.2, 0.8), (0.8, 0.8, 0.8, 1.0), (0.95, 1.05, 1.0)],
)
def test_too_few_runs_one_in_bounds_or_misses_both_ways_are_not(efficiencies):
    assert drift_of(efficiencies, timed_unix_s=0.0) is None


def test_the_drift_says_how_far_which_way_and_how_old_the_timing_is():
    text = Drift((0.78, 0.83, 0.80), timed_unix_s=1000.0).describe(1000.0 + 5 * HOUR)
    assert text == (
        "the last 3 runs decoded 17-22% slower than predicted from this model's timing (5 hours ago), other "
        "processes quiet: this machine's speed has moved since it was timed"
    )
    assert "faster" in Drift((1.2, 1.3, 1.25), 0.0).describe(60.0)


def test_runs_are_kept_per_timing_and_the_third_slow_one_tells(tmp_path):
    timing = a_timing()
    assert note_run(timing, a_run(0.8), tmp_path) is None
    assert note_run(timing, a_run(0.82), tmp_path) is None
    found = note_run(timing, a_run(0.79), tmp_path)
    assert found == Drift((0.8, 0.82, 0.79), timing.created_unix_s)
    assert note_run(a_timing(step_s=0.012), a_run(0.8), tmp_path) is None  # a re-timed model starts afresh
    kept = json.loads((tmp_path / "probe" / "timing" / "runs.json").read_text())
    assert kept[timing_id(timing)] == [0.8, 0.82, 0.79] and kept[timing_id(a_timing(step_s=0.012))] == [0.8]


def test_a_run_in_bounds_ends_the_streak(tmp_path):
    timing = a_timing()
    for e in (0.8, 0.8, 1.0, 0.8, 0.8):
        assert note_run(timing, a_run(e), tmp_path) is None


@pytest.mark.parametrize(
    "run", [a_run(0.5, others=0.9), a_run(0.5, tokens=4), a_run(None), a_run(float("nan"))], ids=str
)
def test_a_busy_a_short_or_an_unpredicted_run_is_not_kept(tmp_path, run):
    timing = a_timing()
    note_run(timing, a_run(0.5), tmp_path)
    note_run(timing, a_run(0.5), tmp_path)
    assert note_run(timing, run, tmp_path) is None  # not a third slow run: not kept at all
    assert note_run(timing, a_run(0.5), tmp_path) is not None


def test_the_file_keeps_the_most_recent_timings_only(tmp_path, monkeypatch):
    monkeypatch.setattr(drift, "KEPT_TIMINGS", 3)
    timings = [a_timing(step_s=0.01 + i / 1000) for i in range(5)]
    for t in timings:
        note_run(t, a_run(0.8), tmp_path)
    kept = json.loads((tmp_path / "probe" / "timing" / "runs.json").read_text())
    assert list(kept) == [timing_id(t) for t in timings[2:]]


@pytest.mark.parametrize("content", ["{not json", '["a", "list"]', '{"abc": "not a list"}', '{"abc": [-1, "x"]}'])
def test_a_damaged_file_is_started_afresh(tmp_path, caplog, content):
    path = tmp_path / "probe" / "timing" / "runs.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    timing = a_timing()
    with caplog.at_level(logging.WARNING):
        for _ in range(drift.RUNS - 1):
            assert note_run(timing, a_run(0.7), tmp_path) is None
    assert note_run(timing, a_run(0.7), tmp_path) is not None
    assert timing_id(timing) in json.loads(path.read_text())


def test_a_cache_that_cannot_be_written_still_gives_this_runs_verdict(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "timing").write_text("a file where the folder should be")
    assert note_run(a_timing(), a_run(0.7), tmp_path) is None  # nothing raised


def test_run_says_when_runs_keep_missing_and_retime_times_again(tmp_path, monkeypatch, capsys, tiny_model):
    """End to end: the tiny model timed on first use; its cached timing then made 1,000 times too fast (a machine
    that slowed down under it); three runs miss and the third says so; `--retime` times it again."""
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("ondevice.probing.host.array_bytes_for", lambda *a, **k: 16 << 20)
    monkeypatch.setattr(drift, "BUSY_CORES", float("inf"))  # the suite may run beside a busy process
    argv = ["run", str(tiny_model), "the", "-n", "24", "--ignore-eos", "-c", "256", "--threads", "1"]
    assert main(argv) == 0
    (stored,) = (tmp_path / "probe" / "timing").glob("[0-9a-f]*.json")
    doc = json.loads(stored.read_text())
    doc["timing"]["decode"] = [[ctx, s / 1000] for ctx, s in doc["timing"]["decode"]]
    stored.write_text(json.dumps(doc))
    capsys.readouterr()
    for _ in range(drift.RUNS):
        assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("slower than predicted from this model's timing") == 1 and "; --retime times it again" in err
    assert main([*argv, "--retime"]) == 0
    err = capsys.readouterr().err
    assert "timing tiny-f16.gguf" in err and "speed has moved" not in err
    assert json.loads(stored.read_text())["timing"]["created_unix_s"] > doc["timing"]["created_unix_s"]
