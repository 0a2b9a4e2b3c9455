"""compare: the statistics on known data, file validation, and scenario matching."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ondevice.bench.compare import FASTER, SAME, SLOWER, bootstrap_ratio, compare_docs, load_results, mann_whitney
from ondevice.bench.record import SCHEMA
from ondevice.core.errors import BenchError


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
    runs.append(
        {
            "scenario": scenario,
            "workload": "w",
            "repeat": len(ttfts),
            "status": "timeout",
            "ttft_s": 99.0,
            "itl_s": [9.0],
        }
    )
    res = {
        "model": model,
        "scenario": scenario,
        "workload": "w",
        "prompt_tokens": 64,
        "output_tokens": 64,
        "runs": runs,
        "ttft_s": {"p50": float(np.median(ttfts))},
        "itl_s": {"p50": itl_scale},
    }
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


def _recorded(doc, *, sha="a" * 64, llama="0.3.36", threads=2, fa=True, ctk="f16", temp=0.8, cpu="AMD EPYC", mid="m1"):
    """doc with a record as `bench` writes it (only what comparability reads)."""
    doc = json.loads(json.dumps(doc))
    label = doc["results"][0]["model"]
    doc["record"].update(
        versions={"llama_cpp_python": llama, "llama_cpp_build": f"{llama}.abc"},
        settings={"sampling": {"temperature": temp, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}},
        host={"cpu_model": cpu, "gpus": [], "machine_id": mid},
        models=[
            {
                "label": label,
                "sha256": sha,
                "n_ctx": 512,
                "engine": {
                    "backend": "CPU",
                    "n_threads": threads,
                    "n_batch": 512,
                    "n_ubatch": 512,
                    "n_ctx": 512,
                    "flash_attn": "auto",
                    "flash_attn_used": fa,
                    "cache_type_k": ctk,
                    "cache_type_v": "f16",
                },
            }
        ],
    )
    return doc


def test_differences_name_what_a_comparison_must_hold_equal():
    from ondevice.bench.comparable import differences

    base = _recorded(_doc("m.gguf", 0.01, A_TTFTS, 1))
    assert differences(base, _recorded(_doc("m.gguf", 0.01, A_TTFTS, 2))) == []
    other = _recorded(
        _doc("m.gguf", 0.01, A_TTFTS, 2),
        sha="b" * 64,
        llama="0.3.37",
        threads=1,
        fa=False,
        ctk="q8_0",
        temp=0.0,
        cpu="Intel Xeon",
        mid="m2",
    )
    assert differences(base, other) == [
        "model sha256 (aaaaaaaaaaaa… vs bbbbbbbbbbbb…)",
        "llama-cpp-python (0.3.36 vs 0.3.37)",
        "threads (2 vs 1)",
        "flash attention (True vs False)",
        "K cache (f16 vs q8_0)",
        "temperature (0.8 vs 0.0)",
        "CPU (AMD EPYC vs Intel Xeon)",
        "machine (m1 vs m2)",
    ]
    # one file of two models: the models differ on purpose, the record is shared
    assert differences(base, other, same_file=True) == [
        "threads (2 vs 1)",
        "flash attention (True vs False)",
        "K cache (f16 vs q8_0)",
    ]


def test_differences_ignore_what_one_side_does_not_state():
    """An ondevice-bench/1 file has no machine id; a bare record states nothing: no difference claimed."""
    from ondevice.bench.comparable import differences

    new = _recorded(_doc("m.gguf", 0.01, A_TTFTS, 1))
    old = _recorded(_doc("m.gguf", 0.01, A_TTFTS, 2), mid=None)
    old["record"]["schema"] = "ondevice-bench/1"
    assert differences(new, old) == []
    assert differences(new, _doc("m.gguf", 0.01, A_TTFTS, 2)) == []


def test_cli_compare_says_not_comparable_and_still_compares(tmp_path, capsys):
    from ondevice.cli.main import main

    fa, fb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    fa.write_text(json.dumps(_recorded(_doc("m.gguf", 0.01, A_TTFTS, 1))))
    fb.write_text(json.dumps(_recorded(_doc("m.gguf", 0.02, [t * 2 for t in A_TTFTS], 2), threads=1, mid="m2")))
    assert main(["bench", "compare", str(fa), str(fb), "--json", str(out)]) == 0  # exit status: documented 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[1] == (
        "not comparable: threads (2 vs 1); machine (m1 vs m2) differ; the verdicts below measure all "
        "of it, not one change"
    )
    assert [line for line in lines if "=> verdict" in line][0].rstrip().endswith(SLOWER)  # the numbers are still there
    doc = json.loads(out.read_text())
    assert doc["comparable"] is False and doc["differences"] == {"m.gguf": ["threads (2 vs 1)", "machine (m1 vs m2)"]}
    assert main(["bench", "compare", str(fa), str(fa), "--json", str(out), "--force"]) == 0
    assert "not comparable" not in capsys.readouterr().out
    assert json.loads(out.read_text())["comparable"] is True


def test_older_schema_is_read_and_unknown_one_refused(tmp_path):
    old = tmp_path / "old.json"
    doc = _doc("m.gguf", 0.01, A_TTFTS, 1)
    doc["record"]["schema"] = "ondevice-bench/1"
    old.write_text(json.dumps(doc))
    assert load_results(old)["record"]["schema"] == "ondevice-bench/1"
    doc["record"]["schema"] = "ondevice-bench/99"
    old.write_text(json.dumps(doc))
    with pytest.raises(BenchError, match="not an ondevice bench result"):
        load_results(old)
