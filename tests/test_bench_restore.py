"""The bench's restore scenario on a real (tiny) engine: a resumed conversation's KV state from disk beside the
recompute and the in-memory hit, its predictions and choice, its table, CSV columns and JSON round trip.
Rows and fields only, never timings."""

from __future__ import annotations

import json

import pytest

from ondevice.bench.report import markdown, render_table, result_document, write_csv
from ondevice.bench.restore import RESTORE_HEADERS, restore_predictions, restore_rows
from ondevice.bench.runner import BenchConfig, run_bench
from ondevice.bench.runs import RESIDENT, RESTORE, RunRecord
from ondevice.bench.stats import scenario_results
from ondevice.bench.suites import custom_suite
from ondevice.engine import load


class LinearPredictor:
    """A prefill of n tokens costs n ms; nothing else is asked of it."""

    def ttft_s(self, n_prompt: int, n_cached: int = 0) -> float:
        return (n_prompt - n_cached) * 1e-3


@pytest.fixture(scope="module")
def outcome(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("states")
    cfg = BenchConfig(
        models=(str(tiny_model),),
        suite=custom_suite((64, 160), (8,), repeats=2, warmup=0),
        scenarios=(RESIDENT, RESTORE),
        cap_to_context=False,
        n_threads=1,
        n_ctx=256,
        state_dir=folder,
    )
    return run_bench(cfg, load_fn=load), folder


def test_restore_runs_record_the_three_sides(outcome):
    out, folder = outcome
    runs = [r for r in out.runs if r.scenario == RESTORE]
    assert [(r.workload, r.status) for r in runs] == [("p64_n8", "ok"), ("p160_n8", "ok")] * 2
    for r in runs:
        s = r.restore
        assert s["history_tokens"] + s["turn_tokens"] == r.prompt_tokens
        assert r.cached_prompt_tokens == s["history_tokens"] == s["hit_cached_tokens"]  # the state held the history
        assert s["state_bytes"] > 0 and s["load_state_s"] >= 0
        assert s["restore_ttft_s"] == pytest.approx(r.timings.ttft_s)  # load_state's time is part of its TTFT
        assert s["hit_ttft_s"] > 0 and s["recompute_ttft_s"] > 0
        assert s["faster"] in ("restore", "recompute")
        # no predictor on a bare engine: no predicted figure, and the choice falls to restore (never wrong)
        assert s["predicted_restore_s"] is None and s["predicted_recompute_s"] is None and s["choice"] == "restore"
        assert RunRecord.from_dict(r.model, json.loads(json.dumps(r.to_dict()))).restore == s
    assert list(folder.iterdir()) == []  # every state file removed


def test_restore_cell_table_and_files(outcome, tmp_path):
    out, _ = outcome
    results = scenario_results(out)
    cells = [r for r in results if r.scenario == RESTORE]
    assert [c.workload for c in cells] == ["p64_n8", "p160_n8"]
    s = cells[1].restore
    assert s["runs"] == 2 and s["measured_runs"] == 2 and s["history_tokens"] == 160 - 20
    assert s["restore_over_hit"] == pytest.approx(s["restore_ttft_s"] / s["hit_ttft_s"])
    # no predictor: the choice falls back to restore and is not judged against the measurement
    assert s["judged_runs"] == 0 and s["choice_right_runs"] == 0 and s["choice"] == "restore (no prediction)"
    assert next(r for r in results if r.scenario == RESIDENT).restore is None
    rows = restore_rows(results)
    assert len(rows) == 2 and all(len(row) == len(RESTORE_HEADERS) for row in rows)
    assert rows[1][:5] == [cells[1].model, "p160_n8", "140", "20", "2/2"]
    assert rows[1][13] == "restore (no prediction)" and rows[1][15] == "-"
    record = {"settings": {"suite": "custom"}}
    assert "restore: TTFT of a resumed conversation" in render_table(record, results)
    assert "## Restore" in markdown(record, results)
    doc = result_document(record, results)
    write_csv(tmp_path / "b.csv", doc)
    header, *lines = (tmp_path / "b.csv").read_text().splitlines()
    assert {"restore_restore_ttft_s", "restore_predicted_recompute_s", "restore_choice"} <= set(header.split(","))
    assert json.loads(json.dumps(doc))["results"][-1]["restore"]["runs"] == 2


def test_predictions_pick_the_side_predicted_faster():
    # 1 MB at 1 GB/s reads in 1 ms; recomputing 1,000 history tokens takes 1 s: restore
    fast = restore_predictions(LinearPredictor(), 1_100, 1_000, 1_000_000, 1.0)
    assert fast["choice"] == "restore" and fast["choice_predicted"]
    assert fast["predicted_read_s"] == pytest.approx(1e-3)
    assert fast["predicted_restore_s"] == pytest.approx(1e-3 + 0.1)
    assert fast["predicted_hit_s"] == pytest.approx(0.1) and fast["predicted_recompute_s"] == pytest.approx(1.1)
    # 10 GB at 1 GB/s (10 s) against 1 s of recompute: recompute
    slow = restore_predictions(LinearPredictor(), 1_100, 1_000, 10_000_000_000, 1.0)
    assert slow["choice"] == "recompute" and "recomputing" in slow["choice_text"]
    # no disk figure: restore, with the read unknown
    unknown = restore_predictions(LinearPredictor(), 1_100, 1_000, 1_000_000, None)
    assert unknown["choice"] == "restore" and unknown["predicted_restore_s"] is None
    assert not unknown["choice_predicted"]


def test_summary_judges_only_predicted_choices():
    def run(repeat, faster, predicted=True):
        figures = {"history_tokens": 448, "turn_tokens": 64, "state_bytes": 10, "restore_ttft_s": 0.2}
        figures |= {"hit_ttft_s": 0.1, "choice": "restore", "choice_predicted": predicted, "faster": faster}
        return RunRecord("m", RESTORE, "p512", repeat, "ok", restore=figures)

    from ondevice.bench.restore import restore_summary

    s = restore_summary([run(0, "restore"), run(1, "recompute"), run(2, "restore", predicted=False)])
    assert (s["measured_runs"], s["restore_faster_runs"], s["judged_runs"], s["choice_right_runs"]) == (3, 2, 2, 1)
    assert s["choice"] == "mixed" and s["restore_over_hit"] == pytest.approx(2.0)
