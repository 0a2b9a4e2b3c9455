"""compare: the statistics on known data, file validation, and scenario matching."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ondevice.bench.compare import SAME, SLOWER, FASTER, bootstrap_ratio, compare_docs, load_results, mann_whitney
from ondevice.bench.record import SCHEMA
from ondevice.errors import BenchError


def test_mann_whitney_matches_hand_computation():
    # a = [1,2,3], b = [4,5,6]: U = 0, n1 = n2 = 3, mu = 4.5, var = 3*3*7/12 = 5.25
    p = mann_whitney(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))
    z = (4.5 - 0.5) / math.sqrt(5.25)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert mann_whitney(np.array([1.0, 2, 3]), np.array([1.0, 2, 3])) == pytest.approx(1.0)


def test_mann_whitney_ties_corrected():
    a, b = np.array([1.0, 1, 2, 2]), np.array([2.0, 2, 3, 3])
    # ranks of all 8: 1,1 -> 1.5; 2 x4 -> 4.5; 3,3 -> 7.5. R_a = 1.5+1.5+4.5+4.5 = 12, U = 12 - 10 = 2
    n1 = n2 = 4
    tie = ((2**3 - 2) + (4**3 - 4) + (2**3 - 2)) / (8 * 7)
    var = n1 * n2 / 12 * (9 - tie)
    z = (abs(2 - 8) - 0.5) / math.sqrt(var)
    assert mann_whitney(a, b) == pytest.approx(math.erfc(z / math.sqrt(2)))


def _runs(rng, n_runs, n_tok, scale, run_sd=0.0):
    return [rng.gamma(20, scale * (1 + rng.normal(0, run_sd)) / 20, n_tok) for _ in range(n_runs)]


def test_bootstrap_same_distribution_contains_one():
    rng = np.random.default_rng(1)
    a, b = _runs(rng, 5, 200, 0.01, 0.02), _runs(rng, 5, 200, 0.01, 0.02)
    ratio, lo, hi = bootstrap_ratio(a, b)
    assert lo < 1 < hi and lo <= ratio <= hi


def test_bootstrap_detects_a_real_shift():
    rng = np.random.default_rng(2)
    a, b = _runs(rng, 5, 200, 0.01), _runs(rng, 5, 200, 0.012)
    ratio, lo, hi = bootstrap_ratio(a, b)
    assert 1.15 < ratio < 1.25 and lo > 1.1


def test_bootstrap_run_drift_widens_the_interval():
    rng = np.random.default_rng(3)
    tight = bootstrap_ratio(_runs(rng, 4, 300, 0.01), _runs(rng, 4, 300, 0.01))
    loose = bootstrap_ratio(_runs(rng, 4, 300, 0.01, 0.15), _runs(rng, 4, 300, 0.01, 0.15))
    assert (loose[2] - loose[1]) > 2 * (tight[2] - tight[1])


def _doc(model, itl_scale, ttfts, seed, scenario="resident"):
    rng = np.random.default_rng(seed)
    runs = []
    for i, t in enumerate(ttfts):
        itl = list(rng.gamma(30, itl_scale / 30, 63))
        runs.append({"scenario": scenario, "workload": "w", "repeat": i, "status": "ok", "ttft_s": t, "itl_s": itl})
    runs.append({"scenario": scenario, "workload": "w", "repeat": len(ttfts), "status": "timeout", "ttft_s": 99.0, "itl_s": [9.0]})
    res = {"model": model, "scenario": scenario, "workload": "w", "prompt_tokens": 64, "output_tokens": 64, "runs": runs,
           "ttft_s": {"p50": float(np.median(ttfts))}, "itl_s": {"p50": itl_scale}}
    return {"record": {"schema": SCHEMA}, "results": [res]}


def test_compare_verdicts():
    a = _doc("m.gguf", 0.01, [0.10, 0.11, 0.105, 0.102, 0.108], 1)
    same = _doc("m.gguf", 0.01, [0.104, 0.107, 0.101, 0.109, 0.103], 2)
    slow = _doc("m.gguf", 0.02, [0.20, 0.21, 0.205, 0.202, 0.208], 3)
    assert compare_docs(a, same)[0].verdict == SAME
    row = compare_docs(a, slow)[0]
    assert row.verdict == SLOWER
    itl = next(m for m in row.metrics if m.metric == "itl_s")
    assert itl.n_a == 5 * 63  # the timed-out run's samples are not compared
    assert compare_docs(slow, a)[0].verdict == FASTER


def test_compare_matches_across_model_names_when_one_each():
    a = _doc("old.gguf", 0.01, [0.1, 0.1, 0.1], 1)
    b = _doc("new.gguf", 0.01, [0.1, 0.1, 0.1], 2)
    assert len(compare_docs(a, b)) == 1
    b["results"][0]["workload"] = "other"
    with pytest.raises(BenchError, match="no scenario in common"):
        compare_docs(a, b)


def test_compare_threshold_validated():
    a = _doc("m", 0.01, [0.1], 1)
    with pytest.raises(BenchError, match="threshold"):
        compare_docs(a, a, threshold=1.5)


def test_load_results_errors(tmp_path):
    with pytest.raises(BenchError, match="no such file"):
        load_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BenchError, match="not JSON"):
        load_results(bad)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"build_commit": "abc", "results": []}))
    with pytest.raises(BenchError, match="not an ondevice bench result"):
        load_results(foreign)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BenchError):
        load_results(binary)
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({"record": {"schema": SCHEMA}, "results": [{"model": "x"}]}))
    with pytest.raises(BenchError, match="malformed"):
        load_results(malformed)


A_TTFTS = [0.10, 0.11, 0.105, 0.102, 0.108]


def test_compare_mixed_when_tested_metrics_disagree():
    a = _doc("m.gguf", 0.01, A_TTFTS, 1)
    b = _doc("m.gguf", 0.02, [t / 2 for t in A_TTFTS], 2)  # twice the ITL, half the TTFT
    row = compare_docs(a, b)[0]
    by = {m.metric: m.verdict for m in row.metrics}
    assert (by["itl_s"], by["ttft_s"], row.verdict) == (SLOWER, FASTER, "mixed")


def test_compare_not_comparable_without_ok_runs():
    a = _doc("m.gguf", 0.01, A_TTFTS, 1)
    b = _doc("m.gguf", 0.01, A_TTFTS, 2)
    for r in b["results"][0]["runs"]:
        r["status"] = "failed"
    for x, y in ((a, b), (b, a)):
        row = compare_docs(x, y)[0]
        assert row.verdict == "not comparable: no ok runs on one side"
        assert all(m.verdict is None for m in row.metrics)


def test_compare_threshold_decides_a_real_but_small_change():
    a = _doc("m.gguf", 0.01, A_TTFTS, 1)
    b = _doc("m.gguf", 0.0112, [t * 1.12 for t in A_TTFTS], 2)  # 12% slower, clear of the noise
    rows = {}
    for threshold, verdict in ((0.05, SLOWER), (0.10, SLOWER), (0.15, SAME)):
        rows[threshold] = row = compare_docs(a, b, threshold=threshold)[0]
        assert [m.verdict for m in row.metrics if m.verdict] == [verdict, verdict], threshold
        assert row.verdict == verdict, threshold
    ttft = next(m for m in rows[0.15].metrics if m.metric == "ttft_s")  # a change, but under the threshold
    assert ttft.ratio == pytest.approx(1.12) and ttft.p_value < 0.05 and ttft.ci_low > 1.0


def test_cli_compare_two_different_files(tmp_path, capsys):
    from ondevice.cli.main import main

    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(_doc("m.gguf", 0.01, A_TTFTS, 1)))
    fb.write_text(json.dumps(_doc("m.gguf", 0.0112, [t * 1.12 for t in A_TTFTS], 2)))
    for extra, verdict in (([], SLOWER), (["--threshold", "0.15"], SAME)):
        out = tmp_path / "c.json"
        assert main(["bench", "compare", str(fa), str(fb), "--json", str(out), "--force", *extra]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "=> verdict" in line]
        assert len(lines) == 1 and lines[0].rstrip().endswith(verdict), lines
        doc = json.loads(out.read_text())
        assert [s["verdict"] for s in doc["scenarios"]] == [verdict]
        assert doc["threshold"] == (0.15 if extra else 0.05) and (doc["a"], doc["b"]) == (str(fa), str(fb))
    assert main(["bench", "compare", str(fb), str(fa)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if "=> verdict" in line][0].rstrip().endswith(FASTER)
