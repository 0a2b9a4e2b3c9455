"""The cold_start scenario: page cache dropped -> load -> first token, its parts, its prediction.

A fake engine and a fake clock give exact arithmetic; one end-to-end run through the real
engine on the tiny synthetic model checks the report and the files.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from ondevice.bench import scenarios as sc
from ondevice.bench.coldstart import predict_cold_start, prompt_for, rows
from ondevice.bench.oscache import PeakRss
from ondevice.bench.runner import BenchConfig, run_bench
from ondevice.bench.runs import COLD_START, RESIDENT, WARM_LOAD, RunRecord
from ondevice.bench.slo import evaluate, parse_slo
from ondevice.bench.stats import build_result, scenario_results
from ondevice.bench.suites import custom_suite
from ondevice.core.results import Timings
from tests.bench_fakes import FakeEngine, FakeLoader

LINUX = sys.platform.startswith("linux")
GB = 1_000_000_000


class TextEngine(FakeEngine):
    """A FakeEngine whose tokenizer round-trips (a word per token), taking text prompts too."""

    def __post_init__(self):
        super().__post_init__()
        self.vocab: dict[str, int] = {}
        self.texts: list[str] = []

    def tokenize(self, text, *, add_bos=True, special=False):
        ids = [self.vocab.setdefault(w, 100 + len(self.vocab)) for w in text.split()]
        return ([1] if add_bos else []) + ids

    def detokenize(self, ids, *, special=False):
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids if i != 1)

    def stream(self, prompt, **kw):
        if isinstance(prompt, str):
            self.texts.append(prompt)
            prompt = self.tokenize(prompt)
        return super().stream(prompt, **kw)


def _ctx(model="m.gguf"):
    return sc.RequestContext(None, model, 0, {}, None, PeakRss())


def _clock(*ns):
    marks = iter(ns)
    return lambda: next(marks)


@pytest.mark.skipif(not LINUX, reason="page-cache eviction is Linux-only")
def test_cold_start_figure_and_parts_add_up(tmp_path):
    """load called at t=0, returns at 0.3 s (llama.cpp's own load_s: 0.25 s); a 64-token prompt
    prefills in 64 ms and samples its first token 2 ms later: 0.366 s from the load call to the
    first token = load 0.25 + tokenize 0 + prefill 0.064 + rest 0.052 (the wrapper's 0.05, the sample's 0.002)."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"\1" * 65536)
    engine = FakeEngine(load_s=0.25, prefill_s_per_token=0.001, first_sample_s=0.002)
    rec, got = sc.cold_start_run(_ctx(), "w", f, lambda: engine, list(range(64)), 64, 7, clock=_clock(0, 300_000_000))
    assert got is engine and rec.ok and rec.scenario == COLD_START
    assert rec.load_s == 0.25 and rec.timings.prefill_s == pytest.approx(0.064) and rec.timings.tokenize_s == 0
    assert rec.cold_start_s == pytest.approx(0.366)
    assert rec.cold_start_rest_s == pytest.approx(0.052)
    assert rec.resident_before_load is not None and rec.resident_before_load <= 0.05
    assert (rec.prompt_tokens, rec.output_tokens, rec.output_tokens_requested) == (64, 1, 1)
    assert engine.calls[0].max_tokens == 1 and not engine.calls[0].reuse_prefix
    d = rec.to_dict()
    assert d["cold_start_s"] == pytest.approx(0.366) and d["cold_start_rest_s"] == pytest.approx(0.052)
    assert RunRecord.from_dict("m.gguf", d).cold_start_s == pytest.approx(0.366)


def test_cold_start_without_eviction_is_skipped_and_a_failed_load_kept(tmp_path, monkeypatch):
    from ondevice.core import pagecache

    f = tmp_path / "m.gguf"
    f.write_bytes(b"\1" * 4096)
    monkeypatch.setattr(
        pagecache,
        "evict_page_cache",
        lambda p: pagecache.Eviction(
            False, "none", None, None, "page-cache eviction is not available on darwin; cold load not measured"
        ),
    )
    rec, engine = sc.cold_start_run(_ctx(), "w", f, lambda: pytest.fail("no load without eviction"), [1, 2], 2, 0)
    assert engine is None and rec.status == "skipped" and "not available" in rec.reason
    monkeypatch.setattr(
        pagecache, "evict_page_cache", lambda p: pagecache.Eviction(True, "posix_fadvise", 1.0, 0.0, "")
    )

    def oom():
        raise MemoryError("cannot map 4 GB")

    rec, engine = sc.cold_start_run(_ctx(), "w", f, oom, [1, 2], 2, 0)
    assert engine is None and rec.status == "failed" and "cannot map" in rec.reason and rec.cold_start_s is None


def test_a_cold_start_drops_every_file_of_a_split_model(tmp_path, monkeypatch):
    from ondevice.core import pagecache

    first, second = tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"
    for f in (first, second):
        f.write_bytes(b"\1" * 4096)
    dropped: list = []
    monkeypatch.setattr(
        pagecache, "evict_page_cache", lambda p: dropped.append(p) or pagecache.Eviction(False, "none", None, None, "x")
    )
    rec, _engine = sc.cold_start_run(_ctx(), "w", first, lambda: pytest.fail("no load"), [1, 2], 2, 0)
    assert dropped == [first, second] and rec.status == "skipped"


def test_prompt_is_text_when_it_round_trips():
    text_engine = TextEngine()
    ids = text_engine.tokenize("alpha beta gamma alpha")
    prompt, note = prompt_for(text_engine, ids)
    assert prompt == "alpha beta gamma alpha" and note == ""
    prompt, note = prompt_for(FakeEngine(), [1, 5, 6])  # no detokenize: the ids, and why
    assert prompt == [1, 5, 6] and "token ids" in note


def test_prediction_worked_example():
    """A 1 GB file on a 2 GB/s disk: 0.5 s to read; the warm load 0.25 s; TTFT 0.1 s: 0.85 s."""
    p = predict_cold_start(file_bytes=GB, disk_read_gbs=2.0, load_overhead_s=0.25, ttft_s=0.1)
    assert p.read_s == pytest.approx(0.5) and p.total_s == pytest.approx(0.85) and p.notes == ()
    missing = predict_cold_start(file_bytes=GB, disk_read_gbs=None, load_overhead_s=None, ttft_s=None)
    assert missing.read_s is None and missing.total_s is None
    assert [n.split(" (")[0] for n in missing.notes] == [
        "no disk read figure",
        "no warm load in this bench",
        "no TTFT prediction",
    ]


class TtftPredictor:
    def __init__(self):
        self.asked = []

    def ttft_s(self, n_prompt, n_cached=0):
        self.asked.append(n_prompt)
        return 0.1


def _outcome(predictor, disk_gbs, call=False):
    """Three cold starts (0.5, 0.6, 0.7 s; load 0.3 s, tokenize 1 ms, prefill 60 ms) and three
    warm loads (0.20, 0.21, 0.22 s; with call: the whole load calls 0.30, 0.31, 0.32 s) of a 1 GB model."""
    suite = custom_suite((64,), (8,))
    w = suite.workloads[0].name
    cold = [
        RunRecord(
            "m.gguf",
            COLD_START,
            w,
            i,
            "ok",
            prompt_tokens=64,
            output_tokens_requested=1,
            load_s=0.3,
            cold_start_s=0.5 + 0.1 * i,
            timings=Timings(0.001, 0.06, 0.08, (), 0.08, 64, 1),
        )
        for i in range(3)
    ]
    warm = [
        RunRecord("m.gguf", WARM_LOAD, "", i, "ok", load_s=0.2 + 0.01 * i, load_call_s=0.3 + 0.01 * i if call else None)
        for i in range(3)
    ]
    plan = SimpleNamespace(
        label="m.gguf",
        spec=SimpleNamespace(file_bytes=GB, kv_bytes_per_token_by_layer=()),
        predictor=predictor,
        disk_read_gbs=disk_gbs,
        disk_note="",
        suite=suite,
    )
    return SimpleNamespace(models=[plan], runs=warm + cold)


def test_scenario_results_carry_the_prediction():
    predictor = TtftPredictor()
    results = scenario_results(_outcome(predictor, 4.0))
    cold = next(r for r in results if r.scenario == COLD_START)
    p = cold.cold_start
    # 1 GB at 4 GB/s = 0.25 s, + warm load p50 0.21 s, + TTFT 0.1 s
    assert (p.read_s, p.load_overhead_s, p.ttft_s) == (pytest.approx(0.25), pytest.approx(0.21), 0.1)
    assert p.total_s == pytest.approx(0.56) and predictor.asked == [64]
    assert cold.summary("cold_start_s").p50 == pytest.approx(0.6) and cold.summary("load_s").p50 == 0.3
    assert cold.summary("cold_start_rest_s").p50 == pytest.approx(0.6 - 0.3 - 0.001 - 0.06)
    d = cold.to_dict()
    assert d["cold_start_predicted"]["total_s"] == pytest.approx(0.56) and d["cold_start_s"]["n"] == 3
    row = rows(results)[0]
    assert row[3] == "0.600/0.690" and row[8] == "0.560" and row[-1] == f"{0.6 / 0.56:.2f}"
    # a predictor without ttft_s (older, or a fake): the TTFT part and the total stay empty, and why
    bare = next(r for r in scenario_results(_outcome(object(), 4.0)) if r.scenario == COLD_START)
    assert bare.cold_start.ttft_s is None and bare.cold_start.total_s is None
    assert any("no TTFT prediction" in n for n in bare.cold_start.notes)
    # the warm load call (ondevice.load's own work included) is the overhead when the bench timed it
    called = next(r for r in scenario_results(_outcome(predictor, 4.0, call=True)) if r.scenario == COLD_START)
    assert called.cold_start.load_overhead_s == pytest.approx(0.31) and called.cold_start.total_s == pytest.approx(0.66)


def test_slo_leaves_the_cold_start_out():
    r = RunRecord(
        "m", COLD_START, "w", 0, "ok", timings=Timings(0, 0.1, 0.1, (), 0.1, 8, 1), cold_start_s=1.0, load_s=0.8
    )
    assert evaluate([r], parse_slo("ttft_p95=1")) is None


def test_runner_measures_the_cold_start_last_with_the_engine_closed(tiny_model):
    loader = FakeLoader()
    cfg = BenchConfig(
        models=(str(tiny_model),),
        suite=custom_suite((64,), (8,), repeats=2, warmup=1),
        scenarios=(WARM_LOAD, RESIDENT, COLD_START),
        cap_to_context=False,
    )
    out = run_bench(cfg, load_fn=loader)
    assert [r.scenario for r in out.runs] == [WARM_LOAD, RESIDENT, COLD_START] * 2
    cold = [r for r in out.runs if r.scenario == COLD_START]
    assert len(loader.loads) == 4  # warm + cold per repeat
    assert all(e.closed for e in loader.engines)
    for r in cold:
        if not LINUX:
            assert r.status == "skipped"
            continue
        assert r.ok and r.prompt_tokens == 64 and r.output_tokens == 1 and r.cold_start_s is not None
        assert any("token ids" in n for n in r.notes)  # the fake's tokenizer does not round-trip
    results = scenario_results(out)
    cell = next(r for r in results if r.scenario == COLD_START)
    assert cell.output_tokens == 1 and cell.cold_start is not None


@pytest.mark.skipif(not LINUX, reason="page-cache eviction is Linux-only")
def test_runner_gives_a_round_tripping_prompt_as_text(tiny_model):
    engines = []

    def load(path, **kw):
        engines.append(TextEngine(n_ctx=kw.get("n_ctx", 4096)))
        return engines[-1]

    cfg = BenchConfig(
        models=(str(tiny_model),),
        suite=custom_suite((32,), (4,), repeats=2, warmup=0),
        scenarios=(COLD_START,),
        cap_to_context=False,
    )
    out = run_bench(cfg, load_fn=load)
    cold = [r for r in out.runs if r.scenario == COLD_START]
    assert [r.status for r in cold] == ["ok", "ok"] and [r.prompt_tokens for r in cold] == [32, 32]
    texts = [t for e in engines for t in e.texts]
    assert len(texts) == 2 and texts[0] == texts[1]  # the same text each repeat: the same work
    assert len(engines) == 3  # one load to build the prompt (nothing else had loaded it), then a cold load per repeat


@pytest.mark.skipif(not LINUX, reason="page-cache eviction is Linux-only")
def test_cli_cold_start_end_to_end(tmp_path, capsys, tiny_model):
    from ondevice.cli.main import main

    out = tmp_path / "cold.json"
    rc = main(
        [
            "bench",
            str(tiny_model),
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "2",
            "-t",
            "1",
            "--scenarios",
            "warm_load,cold-start",
            "--no-progress",
            "--json",
            str(out),
            "--csv",
            str(tmp_path / "c.csv"),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "cold start: page cache dropped -> load -> first token" in text
    doc = json.loads(out.read_text())
    cell = next(r for r in doc["results"] if r["scenario"] == COLD_START)
    assert cell["ok_runs"] == 2 and cell["cold_start_s"]["n"] == 2
    for part in ("load_s", "tokenize_s", "prefill_s", "cold_start_rest_s"):
        assert cell[part]["p50"] is not None, part
    pred = cell["cold_start_predicted"]
    warm = next(r for r in doc["results"] if r["scenario"] == WARM_LOAD)
    assert pred["load_overhead_s"] == pytest.approx(warm["load_call_s"]["p50"])  # the whole warm load call
    assert all(run["load_call_s"] >= run["load_s"] > 0 for run in warm["runs"] + cell["runs"])
    for run in cell["runs"]:
        parts = run["load_s"] + run["tokenize_s"] + run["prefill_s"] + run["cold_start_rest_s"]
        assert parts == pytest.approx(run["cold_start_s"]) and run["tokenize_s"] > 0  # a text prompt, tokenized
    header = (tmp_path / "c.csv").read_text().splitlines()[0]
    assert "cold_start_s_p50" in header and "cold_start_predicted_total_s" in header


def test_build_result_of_a_failed_cold_start_is_empty_not_broken():
    r = RunRecord("m", COLD_START, "w", 0, "failed", reason="boom", prompt_tokens=8, output_tokens_requested=1)
    res = build_result([r], prompt_tokens=8, output_tokens=1)
    assert res.ok_runs == 0 and res.summary("cold_start_s").n == 0
    json.dumps(res.to_dict())


def test_cold_start_table_fits_the_terminal():
    from ondevice.bench.report import markdown, render_table

    results = scenario_results(_outcome(TtftPredictor(), 4.0))
    record = {"settings": {"suite": "custom"}, "models": [], "host": {}, "probe": {"note": "no probe"}}
    narrow, wide = render_table(record, results, width=80), render_table(record, results, width=200)
    assert max(map(len, narrow.splitlines())) <= 80 and max(map(len, wide.splitlines())) <= 200
    words = " ".join(narrow.split())
    for kept in ("cold start", "0.600/0.690", "0.560", "1.07"):  # measured, predicted and their ratio stay
        assert kept in words, kept
    assert "left out" not in wide and "0.250" in wide and "4.00" in wide  # the read part, the disk at 200
    assert "| 0.600/0.690 |" in markdown(record, results)
