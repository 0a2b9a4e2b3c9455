"""Every table the CLI prints fits the terminal it prints to: tried at 80 and 200 columns, the
width passed in (renderers) or a terminal of that width faked (commands). Files keep it all."""

from __future__ import annotations

import os
import shutil

import pytest
from ondevice.quant.ladder import BenchPlan, Ladder, Rung

from ondevice.bench.compare import MetricComparison, ScenarioComparison, render_comparison
from ondevice.bench.report import markdown, render_table
from ondevice.bench.runs import COLD_LOAD, PREFIX_HIT, RESIDENT, RunRecord
from ondevice.bench.stats import build_result
from ondevice.cli import output
from ondevice.cli.main import main
from ondevice.cli.probe import render as render_probe
from ondevice.cli.quant import render_ladder
from ondevice.core.results import Timings
from tests.probe_fakes import fake_result

NARROW, WIDE = 80, 200


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.fixture
def terminal(monkeypatch):
    """A terminal of the given width on stdout (captured output is no terminal: it gets whole tables)."""

    def columns(width: int) -> None:
        monkeypatch.setattr(output, "_stdout_is_terminal", lambda: True)
        monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((width, 24)))

    return columns


def _run(model, scenario, workload, repeat, ttft=0.3112, status="ok", reason=""):
    itl = (0.00017, 0.2407, 0.2487, 0.0033)
    t = Timings(0.0, ttft * 0.9, ttft, itl, ttft + sum(itl), 128, len(itl) + 1)
    return RunRecord(
        model,
        scenario,
        workload,
        repeat,
        status,
        reason=reason,
        prompt_tokens=128,
        output_tokens_requested=len(itl) + 1,
        timings=t,
        load_s=0.02 if scenario == COLD_LOAD else None,
    )


class _Predictor:
    def step_s(self, n_ctx):
        return 1 / 80820, 1 / 892


def _results(models=("gemma-3-270m-it-Q4_K_M.gguf",)):
    out = []
    for m in models:
        out.append(build_result([_run(m, COLD_LOAD, "", i) for i in range(3)]))
        for scenario in (RESIDENT, PREFIX_HIT):
            runs = [_run(m, scenario, "short", i) for i in range(3)]
            runs.append(
                _run(m, scenario, "short", 3, status="failed", reason="llama_decode returned 1 (KV cache full)")
            )
            out.append(build_result(runs, predictor=_Predictor(), prompt_tokens=128, output_tokens=5))
    return out


RECORD = {
    "settings": {"suite": "quick"},
    "models": [],
    "probe": {"note": "no probe cached for CPU"},
    "host": {"cpu_model": "Intel(R) Xeon(R) Processor with a rather long marketing name", "os": "Linux 6.18"},
}


@pytest.mark.parametrize("models", [("one.gguf",), ("gemma-3-270m-it-Q4_K_M.gguf", "qwen3-0.6b-Q8_0.gguf")])
def test_bench_results_fit_80_columns_and_are_whole_at_200(models):
    results = _results(models)
    narrow, wide = render_table(RECORD, results, width=NARROW), render_table(RECORD, results, width=WIDE)
    assert _widest(narrow) <= NARROW < _widest(render_table(RECORD, results))
    words = " ".join(narrow.split())
    for kept in ("resident", "prefix_hit", "short", "311.2/311.2", "122.0/248.7/248.7", " 8.1 ", "TTFT", "ITL"):
        assert kept in words, kept  # scenario, workload, TTFT, ITL, decode stay (headers folded)
    assert "left out to fit 80" in words and "--json/--csv/--md has the full table" in words
    assert "resident short: 1 not ok: llama_decode returned 1 (KV cache full)" in words  # notes under the table
    assert _widest(wide) <= WIDE and "left out" not in wide
    assert "80820/892" in wide and "80820/892" not in narrow  # the roofline: in the table at 200, left out at 80
    assert "80820/892" in markdown(RECORD, results)  # the files keep every column


def _comparison(model="gemma-3-270m-it-Q4_K_M.gguf"):
    tested = [
        MetricComparison(m, 0.3112, 0.3301, 1.061, 0.982, 1.152, 0.0313, 5, 5, "no significant difference")
        for m in ("ttft_s", "itl_s")
    ]
    ratio = [MetricComparison("prefill_tok_s", 412.0, 398.0, 0.966, None, None, None, 0, 0, None)]
    return [
        ScenarioComparison(model, s, "short", tuple(tested + ratio), "no significant difference")
        for s in ("resident", "prefix_hit", "no_kv_cache")
    ]


def test_bench_compare_fits_80_columns_one_line_a_row():
    rows = _comparison()
    narrow = render_comparison(rows, "runs/before.json", "runs/after.json", width=NARROW)
    assert _widest(narrow) <= NARROW
    lines = narrow.splitlines()
    table_rows = [line for line in lines if line.startswith(("resident", "prefix_hit", "no_kv_cache"))]
    assert len(table_rows) == 3 * 4  # a line a metric and one for the verdict: nothing wraps
    assert all("no significant difference" in line or "prefill_tok_s" in line for line in table_rows)
    assert "[0.982, 1.152]" in narrow and "1.061" in narrow  # the ratio and its interval stay
    assert "--json has the full table" in lines[-1] or "--json has the full table" in " ".join(lines[-2:])
    wide = render_comparison(rows, "runs/before.json", "runs/after.json", width=WIDE)
    assert wide == render_comparison(rows, "runs/before.json", "runs/after.json") and _widest(wide) <= WIDE
    assert "311.20 ms" in wide and "0.0313" in wide and "gemma-3-270m-it-Q4_K_M.gguf" in wide


def _ladder():
    rungs = tuple(
        Rung(q, f"/cache/{q}.gguf", False, n, n, n, bpw, 812.4, 402.1, 0.0123, 380.5, 0.0456, ppl, kl, top1, q == "F16")
        for q, n, bpw, ppl, kl, top1 in (
            ("Q4_K_M", 253_000_000, 4.89, 21.345, 0.0213, 0.912),
            ("Q8_0", 292_000_000, 8.5, 20.112, 0.00123, 0.981),
            ("F16", 536_000_000, 16.0, 20.001, 0.0, 1.0),
        )
    )
    return Ladder(
        "models/gemma-3-270m-it-F16.gguf",
        "F16",
        "F16",
        rungs,
        BenchPlan(),
        "CPU",
        "predicted: calibrated by this machine's kernel probe, 0.3 h old",
        "alice.txt",
        512,
        4096,
    )


def test_ladder_fits_80_columns():
    narrow, wide = render_ladder(_ladder(), width=NARROW), render_ladder(_ladder(), width=WIDE)
    assert _widest(narrow) <= NARROW and "Q4_K_M" in narrow and "21.345" in narrow and "91.2%" in narrow
    assert wide == render_ladder(_ladder()) and "812.4" in wide


def test_probe_report_fits_80_columns():
    result = fake_result(build="0.3.36.abc")
    assert _widest(render_probe(result, width=NARROW)) <= NARROW
    assert "ceiling bandwidth" in render_probe(result, width=NARROW)
    assert render_probe(result, width=WIDE) == render_probe(result)


@pytest.mark.parametrize("width", [NARROW, WIDE])
def test_commands_fit_the_terminal(tiny_model, terminal, capsys, width):
    terminal(width)
    for args in (
        ["models"],
        ["info", str(tiny_model)],
        ["info", str(tiny_model), "--tensors"],
        ["predict", str(tiny_model), "--bandwidth", "100", "--ctx", "128,256,512"],
    ):
        assert main(args) == 0, args
        out = capsys.readouterr().out
        assert out.strip() and _widest(out) <= width, (args, out)
    assert output.terminal_width() == width


def test_a_pipe_gets_whole_tables(tiny_model, capsys):
    assert output.terminal_width() is None  # captured stdout is not a terminal
    assert main(["info", str(tiny_model), "--tensors"]) == 0
    assert "left out" not in capsys.readouterr().out
