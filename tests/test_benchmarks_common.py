"""benchmarks/common.py: the helpers every benchmark script shares."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from benchmarks import common


def test_two_sides_swap_every_other_round():
    orders = [common.rotating_order(r, ("a", "b")) for r in range(4)]
    assert orders == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]


def test_each_of_three_sides_runs_in_every_place_once_in_three_rounds():
    orders = [common.rotating_order(r, ("a", "b", "c")) for r in range(3)]
    assert orders == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]
    assert common.rotating_order(3, ("a", "b", "c")) == orders[0]


def test_shared_flags_parse():
    ap = argparse.ArgumentParser()
    common.add_model_arg(ap)
    common.add_threads_arg(ap)
    common.add_pairs_arg(ap, default=7)
    assert vars(ap.parse_args([])) == {"model": None, "threads": None, "pairs": 7}
    assert vars(ap.parse_args(["--model", "m.gguf", "--threads", "2", "--pairs", "3"])) == {
        "model": "m.gguf",
        "threads": 2,
        "pairs": 3,
    }


def test_write_json_leaves_the_old_file_when_the_doc_cannot_be_written(tmp_path):
    path = tmp_path / "run.json"
    common.write_json(path, {"rows": [1, 2]})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    with pytest.raises(ValueError):
        common.write_json(path, {"loop": float("nan"), "bad": object.__new__(Circular)})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


class Circular:
    """An object whose str() refuses, so json.dump fails halfway through writing."""

    def __str__(self) -> str:
        raise ValueError("cannot be written")


def test_cpu_description_names_the_cpu_and_its_count():
    line = common.cpu_description()
    assert line.startswith(f"CPU: {common.cpu_name()}, ") and "logical CPUs" in line


def test_config_path_is_the_tests_copy():
    assert (common.HF_CONFIGS / "llama-3.1-8b.json").is_file()


@pytest.mark.parametrize("name", ["estimate_accuracy", "twin_speed", "bench_overhead"])
def test_scripts_run_as_modules(name):
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"], capture_output=True, text=True, cwd=common.ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_stop_counter_counts_each_continue():
    import os
    import signal

    previous = signal.getsignal(signal.SIGCONT)
    try:
        stops = common.StopCounter()
        assert stops.count == 0
        os.kill(os.getpid(), signal.SIGCONT)  # what a stopped process receives when it is let go on
        os.kill(os.getpid(), signal.SIGCONT)
        assert stops.count == 2
    finally:
        signal.signal(signal.SIGCONT, previous)


def test_speculative_summary_table_has_a_row_per_side_and_set():
    from benchmarks.speculative import summary_table

    figures = {"plain": 20.0, "spec": 30.0, "measured": 1.5, "predicted": 1.4, "agreement": 0.98}
    lines = summary_table({"exact": {"grounded": figures, "open": figures}, "fast": {"grounded": figures}})
    assert len(lines) == 2 + 3 and lines[0].startswith("| side |")
    assert lines[2] == "| exact (exact=True) | grounded | 20.0 | 30.0 | 1.50x | 1.40x | 98.0% |"
    assert lines[4].startswith("| fast (exact=False) | grounded |")


def test_a_speculative_prompt_that_stops_at_its_first_token_is_skipped_not_a_crash(capsys):
    from types import SimpleNamespace

    from benchmarks.speculative import _pairs, report_set

    def run(tok_s, ids=(1, 2, 3)):
        spec = SimpleNamespace(
            predicted_speedup=1.2, speedup_at_acceptance=1.1, drafted=4, accepted=3, steps=1, plain_steps=1, k_cap=4
        )
        return SimpleNamespace(
            timings=SimpleNamespace(decode_tok_s=tok_s, itl_s=[0.01]), token_ids=list(ids), speculative=spec
        )

    stopped = [run(None, (7,)), run(None, (7,))]  # an instruct model answering a raw prompt with end-of-turn
    assert _pairs(stopped, stopped) is None
    decoded = _pairs([run(50.0)], [run(75.0)])
    assert decoded is not None and decoded["speedup"] == 1.5
    figures = report_set("exact grounded", [None, decoded])
    assert figures["measured"] == 1.5
    assert "skipped (stopped before a second token, no decode speed): prompt 0" in capsys.readouterr().out
