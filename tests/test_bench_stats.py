"""Per-scenario statistics and SLO checks on hand-made runs (exact arithmetic)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from ondevice.bench.runs import PREFIX_HIT, RESIDENT, RunRecord
from ondevice.bench.slo import evaluate, parse_slo
from ondevice.bench.stats import build_result, clean
from ondevice.core.errors import BenchError
from ondevice.core.metrics import summarize
from ondevice.core.results import Timings


def run(repeat, ttft, itl, *, status="ok", scenario=RESIDENT, baseline=None, cached=0, prompt=100, rss=None):
    e2e = ttft + sum(itl)
    t = Timings(0.0, ttft * 0.9, ttft, tuple(itl), e2e, prompt - cached, len(itl) + 1)
    return RunRecord(
        "m",
        scenario,
        "w",
        repeat,
        status,
        reason="" if status == "ok" else "boom",
        prompt_tokens=prompt,
        output_tokens_requested=len(itl) + 1,
        cached_prompt_tokens=cached,
        timings=t,
        baseline_ttft_s=baseline,
        peak_rss_bytes=rss,
    )


class StepPredictor:
    def __init__(self):
        self.asked = []

    def step_s(self, n_ctx):
        self.asked.append(n_ctx)
        return 0.005, 0.008


def test_summaries_pool_itls_and_keep_failures():
    runs = [run(0, 0.1, [0.01, 0.02, 0.03]), run(1, 0.3, [0.01, 0.01, 0.01]), run(2, 9.0, [5.0], status="timeout")]
    r = build_result(runs, predictor=StepPredictor(), prompt_tokens=100, output_tokens=4)
    assert (r.repeats, r.ok_runs) == (3, 2)
    itl = r.summary("itl_s")
    assert itl.n == 6 and itl.max == pytest.approx(0.03)  # pooled over ok runs only
    assert r.summary("ttft_s").n == 2 and r.summary("ttft_s").p50 == pytest.approx(0.2)
    assert r.summary("tpot_s").p50 == pytest.approx((0.02 + 0.01) / 2)
    assert r.failures == ({"repeat": 2, "status": "timeout", "reason": "boom"},)
    assert len(r.runs) == 3  # never drop a sample
    for name in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "prefill_tok_s", "decode_tok_s"):
        s = r.summary(name)
        assert s.min <= s.p50 <= s.p95 <= s.p99 <= s.max


# summarize() interpolates linearly between order statistics: numpy's default percentile method
# ("linear", Hyndman-Fan type 7), which is statistics.quantiles(method="inclusive"); std is the
# sample standard deviation (n - 1), statistics.stdev / np.std(ddof=1).
@pytest.mark.parametrize("n", [2, 3, 10, 101, 1000])
def test_summary_matches_numpy_and_statistics(n):
    xs = np.random.default_rng(n).lognormal(-4.0, 0.6, n)  # skewed like real latencies, no ties
    s = summarize([*xs.tolist(), None, math.nan])  # None and NaN samples are not counted
    assert s.n == n
    for got, q in ((s.p50, 50), (s.p95, 95), (s.p99, 99)):
        assert got == pytest.approx(np.percentile(xs, q, method="linear"), rel=1e-12, abs=0)
    cuts = statistics.quantiles(xs.tolist(), n=100, method="inclusive")  # cuts[k - 1] is the k-th percentile
    assert (s.p50, s.p95, s.p99) == pytest.approx((cuts[49], cuts[94], cuts[98]), rel=1e-12, abs=0)
    assert s.p50 == pytest.approx(statistics.median(xs.tolist()), rel=1e-12, abs=0)
    assert s.std == pytest.approx(statistics.stdev(xs.tolist()), rel=1e-12, abs=0)
    assert s.std == pytest.approx(np.std(xs, ddof=1), rel=1e-9, abs=0)
    assert (s.mean, s.min, s.max) == pytest.approx((xs.mean(), xs.min(), xs.max()), rel=1e-12, abs=0)


def test_one_sample_summary():
    s = summarize([0.25])
    assert (s.n, s.p50, s.p95, s.p99, s.mean, s.std, s.min, s.max) == (1, 0.25, 0.25, 0.25, 0.25, 0.0, 0.25, 0.25)


def test_scenario_percentiles_match_numpy_on_pooled_itls():
    rng = np.random.default_rng(42)
    itls = [rng.gamma(20, 0.01 / 20, 63) for _ in range(7)]
    ttfts = rng.gamma(10, 0.1 / 10, 7)
    r = build_result(
        [run(i, float(t), x.tolist()) for i, (t, x) in enumerate(zip(ttfts, itls))], prompt_tokens=100, output_tokens=64
    )
    pooled = np.concatenate(itls)
    for metric, xs in (("itl_s", pooled), ("ttft_s", ttfts)):
        s = r.summary(metric)
        assert s.n == len(xs)
        assert [s.p50, s.p95, s.p99] == pytest.approx(np.percentile(xs, [50, 95, 99]), rel=1e-12, abs=0), metric
        assert s.std == pytest.approx(np.std(xs, ddof=1), rel=1e-9, abs=0), metric
    tpot = np.array([x.mean() for x in itls])  # per request: mean ITL
    assert r.summary("tpot_s").p95 == pytest.approx(np.percentile(tpot, 95), rel=1e-9, abs=0)


def test_roofline_columns_at_mid_context():
    pred = StepPredictor()
    runs = [run(i, 0.1, [0.01] * 9) for i in range(3)]
    r = build_result(runs, predictor=pred, prompt_tokens=100, output_tokens=10)
    assert pred.asked == [105]
    assert r.ceiling_tok_s == pytest.approx(200.0)
    assert r.predicted_tok_s == pytest.approx(125.0)
    assert r.efficiency == pytest.approx(100.0 / 125.0)


def test_no_predictor_no_roofline():
    r = build_result([run(0, 0.1, [0.01] * 3)], prompt_tokens=10, output_tokens=4)
    assert r.ceiling_tok_s is None and r.predicted_tok_s is None and r.efficiency is None


def test_prefix_hit_ttft_saved_and_cached_tokens():
    runs = [run(i, 0.02, [0.01] * 3, scenario=PREFIX_HIT, baseline=0.1, cached=88) for i in range(3)]
    r = build_result(runs, prompt_tokens=100, output_tokens=4)
    assert r.summary("ttft_saved_s").p50 == pytest.approx(0.08)
    assert r.cached_prompt_tokens == 88
    d = r.to_dict()
    assert d["ttft_saved_s"]["p50"] == pytest.approx(0.08) and d["runs"][0]["ttft_saved_s"] == pytest.approx(0.08)


def test_peak_rss_and_kv_bytes(tiny_model):
    from ondevice.gguf.spec import inspect

    spec = inspect(tiny_model)
    r = build_result(
        [run(0, 0.1, [0.01], rss=5), run(1, 0.1, [0.01], rss=9)], spec=spec, prompt_tokens=100, output_tokens=2
    )
    assert r.peak_rss_bytes == 9
    assert r.kv_bytes == spec.kv_read_bytes(102) == 102 * spec.kv_bytes_per_token


def test_all_failed_gives_empty_summaries_and_valid_json():
    r = build_result([run(0, 0.1, [0.01], status="failed")], prompt_tokens=10, output_tokens=2)
    d = r.to_dict()
    assert d["ttft_s"]["n"] == 0 and d["ttft_s"]["p50"] is None
    assert clean({"x": [math.nan, math.inf, 1.0]}) == {"x": [None, None, 1.0]}


def test_parse_slo():
    b = parse_slo("ttft_p95=1.0, tpot_s_p99=0.04,itl_max=0.5")
    assert [(x.metric, x.stat, x.limit_s) for x in b] == [
        ("ttft", "p95", 1.0),
        ("tpot", "p99", 0.04),
        ("itl", "max", 0.5),
    ]


@pytest.mark.parametrize(
    "text,msg",
    [
        ("decode_p95=1", "unknown metric 'decode'"),
        ("ttft=1", "METRIC_STAT=SECONDS"),
        ("ttft_p95", "METRIC_STAT=SECONDS"),
        ("ttft_p95=abc", "not a number"),
        ("ttft_p95=-1", "positive"),
        ("", "no bounds"),
    ],
)
def test_parse_slo_rejects(text, msg):
    with pytest.raises(BenchError, match=msg):
        parse_slo(text)


def test_slo_goodput_and_pass():
    runs = [
        run(0, 0.5, [0.01, 0.01]),
        run(1, 1.5, [0.01, 0.01]),
        run(2, 0.2, [0.05, 0.05]),
        run(3, 0.1, [0.01], status="failed"),
    ]
    s = evaluate(runs, parse_slo("ttft_p50=1.0,tpot_p50=0.03"))
    assert s.requests == 4 and s.good == 1  # run 1 misses TTFT, run 2 misses TPOT, run 3 failed
    assert s.good_share == pytest.approx(0.25)
    # one request at a time: the time is the sum of the four E2Es (0.52 + 1.52 + 0.3 + 0.11 s)
    assert s.time_s == pytest.approx(2.45) and s.goodput_rps == pytest.approx(1 / 2.45)
    assert s.observed_s["ttft_p50"] == pytest.approx(0.5) and s.observed_s["tpot_p50"] == pytest.approx(0.01)
    assert s.passed
    assert not evaluate(runs, parse_slo("ttft_max=1.0")).passed
    assert evaluate(runs, parse_slo("itl_max=0.02")).good == 2  # per request: its own max ITL


def test_goodput_worked_example():
    """Goodput as the second source article defines it: requests meeting the SLO per unit of time.
    Five requests one after another, E2E 0.5, 0.5, 1.0, 2.0 s and one that failed before timing
    anything; SLO e2e_max = 1 s: three meet it, in 4.0 s of requests -> 0.75 req/s, 60% of them."""

    def e2e_run(i, e2e, status="ok"):
        t = Timings(0.0, e2e / 4, e2e / 2, (e2e / 2,), e2e, 10, 2)
        return RunRecord("m", RESIDENT, "w", i, status, reason="boom" if status != "ok" else "", timings=t)

    runs = [
        e2e_run(0, 0.5),
        e2e_run(1, 0.5),
        e2e_run(2, 1.0),
        e2e_run(3, 2.0),
        RunRecord("m", RESIDENT, "w", 4, "failed", reason="boom"),
    ]
    s = evaluate(runs, parse_slo("e2e_max=1.0"))
    assert (s.requests, s.good, s.time_s) == (5, 3, pytest.approx(4.0))
    assert s.goodput_rps == pytest.approx(0.75) and s.good_share == pytest.approx(0.6)
    d = s.to_dict()
    assert d["goodput_rps"] == pytest.approx(0.75) and d["good_share"] == pytest.approx(0.6) and "goodput" not in d
    assert not s.passed  # the scenario's max E2E is 2 s
    # nothing timed: goodput unknown, not 0 req/s
    none = evaluate([RunRecord("m", RESIDENT, "w", 0, "failed", reason="boom")], parse_slo("e2e_max=1.0"))
    assert none.time_s is None and none.goodput_rps is None and none.good_share == 0.0


def test_terminal_and_markdown_tables():
    from ondevice.bench.report import markdown, render_table

    ok = build_result(
        [run(i, 0.1, [0.01] * 3) for i in range(2)], predictor=StepPredictor(), prompt_tokens=100, output_tokens=4
    )
    bad = build_result([run(0, 0.1, [0.01], status="failed", scenario=PREFIX_HIT)], prompt_tokens=100, output_tokens=4)
    slo = {("m", RESIDENT, "w"): evaluate(list(ok.runs), parse_slo("ttft_p95=0.05"))}
    record = {
        "settings": {"suite": "custom"},
        "incomplete": True,
        "models": [],
        "host": {},
        "probe": {"note": "no probe"},
    }
    text = render_table(record, [ok, bad], slo, width=240)
    assert "INCOMPLETE" in text and "resident" in text and "prefix_hit" in text
    assert "100.0" in text  # decode tok/s p50 of 10 ms steps
    assert "200/125" in text and "0.80" in text  # roofline ceiling/prediction and efficiency
    assert "SLO FAIL, goodput 0 req/s (0% of requests)" in text and "1 not ok: boom" in text
    md = markdown(record, [ok, bad], slo)
    assert md.count("\n| m | ") == 2 and "| resident | w | 100 | 4 | 2/2 |" in md


class RequestPredictor(StepPredictor):
    """Prefill: 1 ms per computed prompt token; decode: 8 ms per step."""

    def ttft_s(self, n_prompt, n_cached=0, n_batch=512):
        return 0.001 * (n_prompt - n_cached)

    def decode_s(self, n_prompt, n_output):
        return 0.008 * (n_output - 1)


def test_predicted_ttft_and_e2e_beside_the_measured():
    runs = [run(0, 0.2, [0.01] * 3), run(1, 0.25, [0.01] * 3)]
    r = build_result(runs, predictor=RequestPredictor(), prompt_tokens=100, output_tokens=4)
    assert r.predicted_ttft_s == pytest.approx(0.1) and r.ttft_efficiency == pytest.approx(0.1 / 0.225)
    assert r.predicted_e2e_s == pytest.approx(0.1 + 3 * 0.008)
    hits = [
        run(0, 0.05, [0.01] * 3, scenario=PREFIX_HIT, cached=80),
        run(1, 0.05, [0.01] * 3, scenario=PREFIX_HIT, cached=80),
    ]
    h = build_result(hits, predictor=RequestPredictor(), prompt_tokens=100, output_tokens=4)
    assert h.predicted_ttft_s == pytest.approx(0.02)  # only the 20 tokens the cache lacked
    plain = build_result(runs, predictor=StepPredictor(), prompt_tokens=100, output_tokens=4)
    assert plain.predicted_ttft_s is None and plain.ttft_efficiency is None  # a predictor without prefill
    d = r.to_dict()
    assert d["predicted_ttft_s"] == r.predicted_ttft_s and d["predicted_e2e_s"] == r.predicted_e2e_s
