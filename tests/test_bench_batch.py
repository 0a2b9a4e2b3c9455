"""`bench --batch`: the sweep's plan (interleaving, warm-up, prompts), its summary, knee and SLO logic on
fake batch generations with exact timings, the report files, and the CLI's bad input."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest

from ondevice.bench.batch import SweepConfig, SweepRun, check_levels, run_sweep, summarize_sweep
from ondevice.bench.batch_report import render_sweep, sweep_document, write_sweep_csv
from ondevice.bench.slo import parse_slo
from ondevice.bench.suites import Workload
from ondevice.cli.main import main
from ondevice.core.errors import BenchError
from ondevice.core.metrics import timings_from_marks
from ondevice.core.results import Generation
from ondevice.engine.batch import BatchGeneration

W = Workload("p8_n5", 8, 5)
_NS = 1_000_000_000


def fake_batch(
    b: int, step_s: float, prefill_s: float = 0.1, n: int = 5, predicted_step_s: float | None = None
) -> BatchGeneration:
    """A batch generation with exact timings: prompt i's first token after (i + 1) prefill shares,
    then one token per step for every sequence."""
    gens = []
    steps_start = prefill_s
    for i in range(b):
        first = prefill_s * (i + 1) / b
        marks = [round(first * _NS)] + [round((steps_start + k * step_s) * _NS) for k in range(1, n)]
        t = timings_from_marks(0, 0, 0, round(first * _NS), marks, W.prompt_tokens)
        gens.append(Generation("x" * n, (7,) * n, "length", W.prompt_tokens, 0, t))
    return BatchGeneration(
        tuple(gens),
        steps_start + (n - 1) * step_s,
        prefill_s,
        (step_s,) * (n - 1),
        (b,) * (n - 1),
        predicted_step_s,
        None,
    )


def runs_for(step_s_by_b: dict[int, float], repeats: int = 2, **kw) -> list[SweepRun]:
    return [SweepRun(b, r, "ok", result=fake_batch(b, s, **kw)) for r in range(repeats) for b, s in step_s_by_b.items()]


def config(levels) -> SweepConfig:
    return SweepConfig(tuple(levels), W, repeats=2, warmup=1)


# ---- summary, knee, SLO ----------------------------------------------------------------------
def test_level_figures_from_exact_timings():
    result = summarize_sweep(config([1, 4]), runs_for({1: 0.02, 4: 0.025}, predicted_step_s=0.02))
    one, four = result.levels
    assert four.decode_tok_s == pytest.approx(4 / 0.025) and one.decode_tok_s == pytest.approx(50)
    assert four.output_tok_s == pytest.approx(20 / (0.1 + 4 * 0.025))  # wall: prefill + 4 steps
    assert four.itl_s.n == 2 * 4 * 4  # T - 1 per sequence, pooled over sequences and repeats
    assert four.itl_s.p50 == pytest.approx(0.025)
    assert four.ttft_s.p50 == pytest.approx((0.05 + 0.075) / 2)  # the shared prefill is in each TTFT
    assert four.predicted_decode_tok_s == pytest.approx(4 / 0.02)
    assert four.efficiency == pytest.approx((4 / 0.025) / (4 / 0.02))
    assert four.scaling == pytest.approx((160 / 50 - 1) / 3)
    assert one.scaling is None and one.ok_runs == one.runs == 2


def test_per_sequence_decode_rate_is_one_over_tpot():
    lv = summarize_sweep(config([2]), runs_for({2: 0.03})).levels[0]
    rates = [1 / x.timings.tpot_s for x in fake_batch(2, 0.03).generations]
    assert rates[0] < rates[1]  # the first sequence's first ITL holds the second prompt's prefill
    assert lv.seq_decode_tok_s == pytest.approx(statistics.median(rates * 2))


def test_knee_is_the_last_level_before_scaling_falls_below_half():
    # aggregate decode: 50, 95 (0.9 of proportional), 170 (0.79), 200 (0.18), 390 (0.95 again: past the knee)
    steps = {1: 1 / 50, 2: 2 / 95, 4: 4 / 170, 8: 8 / 200, 16: 16 / 390}
    result = summarize_sweep(config(steps), runs_for(steps))
    assert [round(lv.scaling, 2) if lv.scaling is not None else None for lv in result.levels] == [
        None,
        0.9,
        0.79,
        0.18,
        0.95,
    ]
    assert result.knee == 4


def test_knee_needs_two_measured_levels_and_skips_failed_ones():
    assert summarize_sweep(config([4]), runs_for({4: 0.02})).knee is None
    runs = runs_for({1: 0.02, 4: 0.022}) + [SweepRun(2, r, "failed", "ModelLoadError: no memory") for r in range(2)]
    result = summarize_sweep(config([1, 2, 4]), runs)
    two = result.levels[1]
    assert two.decode_tok_s is None and two.ok_runs == 0 and two.failures[0].startswith("#1 failed: ModelLoadError")
    assert result.levels[2].scaling == pytest.approx((4 / 0.022 / 50 - 1) / 3)  # against B=1, the last measured
    assert result.knee == 4


def test_slo_marks_the_largest_batch_whose_itl_p95_meets_it():
    steps = {1: 0.02, 2: 0.03, 4: 0.05, 8: 0.09}
    result = summarize_sweep(config(steps), runs_for(steps, prefill_s=0.001), parse_slo("itl_p95=0.06"))
    assert [lv.slo.passed for lv in result.levels] == [True, True, True, False]
    assert result.slo_max_seqs == 4
    assert 0.05 <= result.levels[2].slo.observed_s["itl_p95"] < 0.051  # the first ITLs hold part of the prefill
    # an earlier sequence's first ITL includes the later prompts' prefill (0.1 s shared here)
    result = summarize_sweep(config(steps), runs_for(steps), parse_slo("itl_max=0.06"))
    assert [lv.slo.passed for lv in result.levels] == [True, False, False, False]
    assert result.levels[1].slo.observed_s["itl_max"] == pytest.approx(0.05 + 0.03)


def test_failed_runs_count_as_misses_in_the_slo():
    runs = runs_for({2: 0.02}, repeats=1) + [SweepRun(2, 1, "failed", "EngineError: boom")]
    lv = summarize_sweep(config([2]), runs, parse_slo("itl_p95=1")).levels[0]
    assert lv.slo.requests == 4 and lv.slo.good == 2 and lv.slo.passed


# ---- checks before any work ------------------------------------------------------------------
def test_check_levels():
    assert check_levels((8, 1, 2), W) == (1, 2, 8)
    for bad, msg in (((0,), "from 1 to 256"), ((257,), "from 1 to 256"), ((2, 2), "named twice"), ((), "at least one")):
        with pytest.raises(BenchError, match=msg):
            check_levels(bad, W)
    with pytest.raises(BenchError, match="trained context of 10"):
        check_levels((1,), W, n_ctx_train=10)
    assert check_levels((4,), W, n_ctx=1024) == (4,)
    with pytest.raises(BenchError, match=r"5 sequences of 13 tokens \(256 each.*need 1280.*--n-ctx is 1024"):
        check_levels((1, 5), W, n_ctx=1024)


# ---- the sweep's plan, on a fake engine -----------------------------------------------------
class FakeBatch:
    def __init__(self, engine, b):
        self.engine, self.b, self.closed = engine, b, False

    def generate(self, prompts, max_tokens, *, seed=None, ignore_eos=False, **sampling):
        self.engine.calls.append((self.b, [tuple(p) for p in prompts], max_tokens, seed, ignore_eos, sampling))
        if self.engine.fail_at == len(self.engine.calls):
            raise RuntimeError("boom")
        if self.engine.interrupt_at == len(self.engine.calls):
            raise KeyboardInterrupt
        return fake_batch(self.b, 0.01 * self.b, n=max_tokens)

    def close(self):
        self.closed = True


class FakeEngine:
    def __init__(self, fail_at=None, interrupt_at=None, broken=()):
        self.calls, self.contexts = [], []
        self.fail_at, self.interrupt_at, self.broken = fail_at, interrupt_at, broken

    def tokenize(self, text, add_bos=True):
        return ([1] if add_bos else []) + [100 + sum(map(ord, w)) % 300 for w in text.split()]

    def batched(self, b, seq_tokens):
        assert seq_tokens == W.prompt_tokens + W.output_tokens
        if b in self.broken:
            from ondevice.core.errors import ModelLoadError

            raise ModelLoadError(f"llama.cpp could not create a context of {b * 256} tokens")
        self.contexts.append(FakeBatch(self, b))
        return self.contexts[-1]


def test_warmup_then_repeats_interleaved_in_rotating_order():
    eng = FakeEngine()
    cfg = SweepConfig((1, 2, 4), W, repeats=3, warmup=1, sampling={"temperature": 0.0}, seed=7)
    events = []
    outcome = run_sweep(eng, cfg, progress=events.append)
    order = [c[0] for c in eng.calls]
    assert order == [1, 2, 4] + [1, 2, 4] + [2, 4, 1] + [4, 1, 2]
    assert [(r.n_seqs, r.repeat) for r in outcome.runs] == [
        (1, 0),
        (2, 0),
        (4, 0),
        (2, 1),
        (4, 1),
        (1, 1),
        (4, 2),
        (1, 2),
        (2, 2),
    ]
    assert all(c[2] == 5 and c[4] is True and c[5] == {"temperature": 0.0} for c in eng.calls)
    assert [c[3] for c in eng.calls[3:6]] == [7, 7, 7] and eng.calls[6][3] == 8  # seed + repeat
    prompts = [p for c in eng.calls for p in c[1]]
    assert all(len(p) == W.prompt_tokens for p in prompts)
    assert len(set(prompts)) == len(prompts)  # every sequence of every run has its own prompt
    assert all(ctx.closed for ctx in eng.contexts) and len(eng.contexts) == 3
    assert events[-1].done == events[-1].total == 12 and not outcome.incomplete


def test_failures_are_kept_and_ctrl_c_keeps_what_was_gathered():
    eng = FakeEngine(fail_at=4, broken=(2,))
    outcome = run_sweep(eng, SweepConfig((1, 2, 4), W, repeats=2, warmup=1))
    by = {(r.n_seqs, r.repeat): r for r in outcome.runs}
    assert len(outcome.runs) == 6
    assert by[(1, 0)].status == "ok" and by[(4, 0)].status == "failed" and "boom" in by[(4, 0)].reason
    assert all(by[(2, r)].status == "failed" and "ModelLoadError" in by[(2, r)].reason for r in range(2))
    eng = FakeEngine(interrupt_at=4)
    outcome = run_sweep(eng, SweepConfig((1, 2), W, repeats=3, warmup=1))
    assert outcome.incomplete and len(outcome.runs) == 1 and all(c.closed for c in eng.contexts)


# ---- report files ----------------------------------------------------------------------------
def test_document_csv_and_table(tmp_path):
    steps = {1: 0.02, 2: 0.021, 4: 0.05}
    runs = runs_for(steps, predicted_step_s=0.02, prefill_s=0.001)
    result = summarize_sweep(config(steps), runs, parse_slo("itl_p95=0.03"))
    record = {"settings": {"suite": "batch"}, "models": [], "host": {}}
    doc = sweep_document(record, W, result, runs)
    json.dumps(doc, allow_nan=False)
    assert doc["batch"]["knee"] == 2 and doc["batch"]["slo_max_seqs"] == 2
    assert len(doc["batch"]["runs"]) == 6 and doc["batch"]["runs"][0]["result"]["n_seqs"] == 1
    write_sweep_csv(tmp_path / "b.csv", doc)
    rows = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert [r["n_seqs"] for r in rows] == ["1", "2", "4"] and [r["knee"] for r in rows] == ["False", "True", "False"]
    assert math.isclose(float(rows[2]["decode_tok_s"]), 80) and rows[2]["slo_passed"] == "False"
    text = render_sweep(record, W, result, width=None)
    assert "knee: B=2" in text and "SLO: largest B meeting it: 2" in text
    line = next(x for x in text.splitlines() if x.startswith("2 "))
    assert "knee" in line and "SLO pass (largest B)" in line
    assert max(map(len, render_sweep(record, W, result, width=72).splitlines())) <= 72


# ---- the CLI ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--batch", "0"], "--batch 0: must be greater than 0"),
        (["--batch", "1,300"], "from 1 to 256"),
        (["--batch", "2,2"], "named twice"),
        (["--batch", "1,x"], "comma-separated whole numbers"),
        (
            ["--batch", "1,64", "-p", "200", "-n", "56", "--n-ctx", "4096"],
            "need 16384 tokens of context; --n-ctx is 4096",
        ),
        (["--batch", "1", "-p", "64,128"], "one -p and one -n"),
        (["--batch", "1", "--url", "http://127.0.0.1:9/v1"], "--url does not go with --batch"),
        (["--batch", "1", "--scenarios", "resident"], "--scenarios does not go with --batch"),
        (["--batch", "1", "--concurrency", "2"], "--concurrency applies to server benchmarks"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_loading(argv, msg, capsys, monkeypatch, tiny_model):
    import ondevice.bench.runner as runner

    monkeypatch.setattr(runner, "load_plan", lambda *a, **k: pytest.fail("loaded a model on bad input"))
    assert main(["bench", str(tiny_model), *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_two_models_refused(capsys, tiny_model):
    assert main(["bench", str(tiny_model), str(tiny_model), "--batch", "1", "--no-progress"]) == 2
    assert "one model" in capsys.readouterr().err


def test_sweep_end_to_end_on_the_tiny_model(tmp_path, capsys, tiny_model):
    files = {k: tmp_path / f"b.{k}" for k in ("json", "csv", "md")}
    rc = main(
        [
            "bench",
            str(tiny_model),
            "--batch",
            "1,2",
            "-p",
            "16",
            "-n",
            "6",
            "-r",
            "2",
            "--no-progress",
            "--slo",
            "itl_p95=30",
            "--temperature",
            "0",
            "--json",
            str(files["json"]),
            "--csv",
            str(files["csv"]),
            "--md",
            str(files["md"]),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(files["json"].read_text())
    assert (
        doc["record"]["settings"]["batch"] == {"levels": [1, 2], "n_ctx": None}
        and doc["record"]["models"][0]["engine"]["backend"]
    )
    levels = doc["batch"]["levels"]
    assert [lv["n_seqs"] for lv in levels] == [1, 2] and all(lv["ok_runs"] == 2 for lv in levels)
    assert levels[1]["itl_s"]["n"] == 2 * 2 * 5 and doc["batch"]["slo_max_seqs"] == 2
    for run in doc["batch"]["runs"]:
        gens = run["result"]["generations"]
        assert len(gens) == run["n_seqs"] and all(len(g["token_ids"]) == 6 for g in gens)
        assert sum(run["result"]["step_seqs"]) == run["n_seqs"] * 5
    assert len(list(csv.reader(files["csv"].open()))) == 3
    assert "| B |" in files["md"].read_text() and "knee" in out
