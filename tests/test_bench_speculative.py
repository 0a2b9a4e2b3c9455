"""The bench's speculative scenario on a real (tiny) engine: pairs of plain and prompt-lookup runs,
its own summary, table, CSV columns and JSON round trip."""

from __future__ import annotations

import json

from ondevice.bench.report import markdown, render_table, result_document, write_csv
from ondevice.bench.runner import BenchConfig, run_bench
from ondevice.bench.runs import RESIDENT, SPECULATIVE, RunRecord
from ondevice.bench.stats import scenario_results
from ondevice.bench.suites import custom_suite
from ondevice.engine import load


def test_speculative_scenario_pairs_plain_and_lookup_runs(tiny_model, tmp_path):
    cfg = BenchConfig(
        models=(str(tiny_model),),
        suite=custom_suite((48,), (16,), repeats=2, warmup=1),
        scenarios=(RESIDENT, SPECULATIVE),
        cap_to_context=False,
        n_threads=1,
        n_ctx=256,
    )
    out = run_bench(cfg, load_fn=load)
    spec_runs = [r for r in out.runs if r.scenario == SPECULATIVE]
    assert [r.status for r in spec_runs] == ["ok", "ok"]
    for r in spec_runs:
        assert r.speculative["mode"] == "lookup" and r.speculative["plain_decode_tok_s"] > 0
        assert r.output_tokens == 16 and r.cached_prompt_tokens == 0
        assert RunRecord.from_dict(r.model, json.loads(json.dumps(r.to_dict()))).speculative == r.speculative
    results = scenario_results(out)
    cell = next(r for r in results if r.scenario == SPECULATIVE)
    s = cell.speculative
    assert s["pairs"] == 2 and s["speedup_p50"] > 0 and s["plain_decode_tok_s"] > 0
    assert s["verify_steps"] + s["plain_steps"] == 2 * 15
    assert next(r for r in results if r.scenario == RESIDENT).speculative is None
    record = {"settings": {"suite": "custom"}}
    text = render_table(record, results)
    assert "speculative decoding (prompt lookup)" in text and "speedup p50" in text
    assert "## Speculative decoding" in markdown(record, results)
    doc = result_document(record, results)
    write_csv(tmp_path / "b.csv", doc)
    header, *rows = (tmp_path / "b.csv").read_text().splitlines()
    assert "spec_speedup_p50" in header.split(",")
