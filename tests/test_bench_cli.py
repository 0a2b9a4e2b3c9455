"""`ondevice bench` end to end on synthetic models through the real engine, and its bad input."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from pathlib import Path

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.cli.main import main
from tests.file_fakes import SPECIAL_KINDS, file_kind, special_file

LAYOUT = {
    "model",
    "scenario",
    "prompt_tokens",
    "output_tokens",
    "repeats",
    "ttft_s",
    "itl_s",
    "tpot_s",
    "e2e_s",
    "prefill_tok_s",
    "decode_tok_s",
    "ceiling_tok_s",
    "predicted_tok_s",
    "efficiency",
    "failures",
    "runs",
}
STATS = ("p50", "p95", "p99", "mean", "std", "min", "max")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tiny_model):
    d = tmp_path_factory.mktemp("bench_quick")
    files = {k: d / f"run.{k}" for k in ("json", "csv", "md")}
    rc = main(
        [
            "bench",
            str(tiny_model),
            "--suite",
            "quick",
            "--no-kv-cache",
            "--no-progress",
            "--slo",
            "ttft_p95=30,tpot_p95=5",
            "--json",
            str(files["json"]),
            "--csv",
            str(files["csv"]),
            "--md",
            str(files["md"]),
        ]
    )
    return rc, files, json.loads(files["json"].read_text())


def test_quick_suite_json_record(quick_run, tiny_model):
    rc, _, doc = quick_run
    assert rc == 0
    rec = doc["record"]
    assert rec["schema"] == "ondevice-bench/2" and rec["incomplete"] is False and rec["host"]["machine_id"]
    assert "bench" in rec["command_line"] and rec["started_at"] and rec["versions"]["llama_cpp_python"]
    assert rec["settings"]["sampling"]["ignore_eos"] is True and rec["settings"]["suite"] == "quick"
    assert rec["host"].get("os") and rec["probe"]  # probe results or the note saying there are none
    m = rec["models"][0]
    assert m["sha256"] == hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    assert m["quant"] == "F16" and m["engine"]["backend"] and m["engine"]["n_threads"] >= 1
    assert m["n_ctx"] >= 160 and m["engine"]["n_ctx"] == m["n_ctx"]


def test_quick_suite_json_results(quick_run):
    _, _, doc = quick_run
    by = {r["scenario"]: r for r in doc["results"]}
    assert set(by) == {"cold_load", "warm_load", "resident", "prefix_hit", "no_kv_cache", "cold_start"}
    for r in doc["results"]:
        assert LAYOUT <= set(r), r["scenario"]
        assert r["failures"] == [] and r["repeats"] == 3 and len(r["runs"]) == 3
        for metric in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "prefill_tok_s", "decode_tok_s", "load_s"):
            s = r[metric]
            if s["n"]:
                assert s["min"] <= s["p50"] <= s["p95"] <= s["p99"] <= s["max"], (r["scenario"], metric)
                assert s["std"] >= 0
    for name in ("cold_load", "warm_load"):
        assert all(run["load_s"] > 0 for run in by[name]["runs"])
    assert all(run["cached_prompt_tokens"] == 0 for run in by["resident"]["runs"])
    hit = by["prefix_hit"]
    assert all(run["cached_prompt_tokens"] >= 100 for run in hit["runs"])  # 128 - 16 shared
    assert all(run["baseline_ttft_s"] is not None for run in hit["runs"])
    assert by["resident"]["slo"]["requests"] == 3 and 0 <= by["resident"]["slo"]["good_share"] <= 1
    assert by["resident"]["slo"]["goodput_rps"] == pytest.approx(
        by["resident"]["slo"]["good"] / by["resident"]["slo"]["time_s"]
    )
    assert by["no_kv_cache"]["kv_cache_speedup"] is not None
    cold = by["cold_start"]  # page cache dropped -> load -> first token, and its parts
    assert (
        "slo" not in cold and cold["cold_start_predicted"]["load_overhead_s"] == by["warm_load"]["load_call_s"]["p50"]
    )
    for run in cold["runs"]:
        assert run["cold_start_s"] > run["load_s"] > 0 and run["output_tokens"] == 1
        assert run["load_s"] + run["tokenize_s"] + run["prefill_s"] + run["cold_start_rest_s"] == pytest.approx(
            run["cold_start_s"]
        )


def test_quick_suite_per_run_identities(quick_run):
    _, _, doc = quick_run
    n_runs = 0
    for r in doc["results"]:
        if r["scenario"] in ("cold_load", "warm_load", "cold_start"):
            continue
        for run in r["runs"]:
            n_runs += 1
            t = run["output_tokens"]
            assert run["status"] == "ok" and t == run["output_tokens_requested"] == r["output_tokens"]
            assert run["prompt_tokens"] == r["prompt_tokens"]
            assert len(run["itl_s"]) == t - 1
            assert run["tpot_s"] == pytest.approx((run["e2e_s"] - run["ttft_s"]) / (t - 1), rel=1e-9)
            assert run["tpot_s"] == pytest.approx(sum(run["itl_s"]) / (t - 1), rel=1e-6)
            assert run["e2e_s"] >= run["ttft_s"] >= run["prefill_s"] >= 0
            assert all(x >= 0 for x in run["itl_s"])
    assert n_runs == 9


def test_quick_suite_csv_and_markdown(quick_run):
    _, files, doc = quick_run
    rows = list(csv.DictReader(files["csv"].open()))
    assert len(rows) == len(doc["results"])
    resident = next(r for r in rows if r["scenario"] == "resident")
    assert math.isclose(
        float(resident["itl_s_p50"]), next(r for r in doc["results"] if r["scenario"] == "resident")["itl_s"]["p50"]
    )
    md = files["md"].read_text()
    assert "| model | scenario |" in md and "resident" in md and "sha256" in md


@pytest.fixture(scope="module")
def synth_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_cmp")
    base = dict(d_model=256, n_head=4, n_head_kv=2, d_ff=768, n_vocab=512, n_ctx_train=512)
    small = build_synthetic_model(SynthConfig(n_layer=2, seed=5, **base), d / "small.gguf")
    large = build_synthetic_model(SynthConfig(n_layer=12, seed=6, **base), d / "large.gguf")
    return small, large


# Live timings on a shared machine drift by 10-40% within minutes, so the end-to-end runs
# here check the path (bench two models interleaved into one file, compare the file) and not
# the verdict. The verdicts (the same model never 1.5x faster or slower than itself, six times
# the layers always slower) are checked on live runs by benchmarks/compare_verdicts.py, and
# here on runs it recorded (its --record writes tests/data/bench/). The 5% verdicts themselves
# are checked on known data in test_bench_compare.py.
LIVE_THRESHOLD = "0.5"
RECORDED = Path(__file__).resolve().parent / "data" / "bench"
VERDICTS = ("no significant difference", "slower", "faster", "mixed", "not comparable: no ok runs on one side")


def _verdict_lines(capsys, argv) -> list[str]:
    assert main(argv) == 0
    return [line.rstrip() for line in capsys.readouterr().out.splitlines() if "=> verdict" in line]


def _bench_compare(tmp_path, capsys, models, name):
    out = tmp_path / f"{name}.json"
    rc = main(
        [
            "bench",
            *map(str, models),
            "-p",
            "32",
            "-n",
            "48",
            "-r",
            "5",
            "-t",
            "1",
            "--scenarios",
            "resident",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    capsys.readouterr()
    verdicts = _verdict_lines(capsys, ["bench", "compare", str(out), "--threshold", LIVE_THRESHOLD])
    assert verdicts and all(line.endswith(VERDICTS) for line in verdicts), verdicts
    return verdicts, out


def test_compare_same_configuration_runs(tmp_path, capsys, synth_pair):
    small, _ = synth_pair
    _, out = _bench_compare(tmp_path, capsys, [small, small], "same")
    doc = json.loads(out.read_text())
    assert {r["model"] for r in doc["results"]} == {"small.gguf", "small.gguf#1"}


def test_compare_slowed_side_runs(tmp_path, capsys, synth_pair):
    small, large = synth_pair  # six times the layers: the deliberately slowed side
    _, out = _bench_compare(tmp_path, capsys, [small, large], "slowed")
    assert [r["model"] for r in json.loads(out.read_text())["results"]] == ["small.gguf", "large.gguf"]


def test_compare_recorded_same_configuration_is_noise(capsys):
    verdicts = _verdict_lines(capsys, ["bench", "compare", str(RECORDED / "same.json"), "--threshold", LIVE_THRESHOLD])
    assert verdicts and all(line.endswith("no significant difference") for line in verdicts), verdicts


def test_compare_recorded_slowed_side_is_slower(capsys):
    verdicts = _verdict_lines(
        capsys, ["bench", "compare", str(RECORDED / "slowed.json"), "--threshold", LIVE_THRESHOLD]
    )
    assert verdicts and all(line.endswith("slower") for line in verdicts), verdicts


def test_compare_two_files(tmp_path, capsys, quick_run):
    _, files, _ = quick_run
    assert main(["bench", "compare", str(files["json"]), str(files["json"]), "--json", str(tmp_path / "c.json")]) == 0
    doc = json.loads((tmp_path / "c.json").read_text())
    assert all(s["verdict"] == "no significant difference" for s in doc["scenarios"])


def _bad(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--suite", "huge"], "unknown suite"),
        (["-p", "0"], "-p 0"),
        (["-n", "0"], "-n 0"),
        (["-p", "600"], "exceeds the context"),
        (["-n", "abc"], "-n 'abc'"),
        (["--suite", "quick", "-p", "8"], "either --suite or -p/-n"),
        (["--slo", "latency_p95=1"], "unknown metric"),
        (["--scenarios", "hot_load"], "unknown scenario"),
        (["--timeout", "0"], "--timeout"),
        (["-r", "0"], "--repeat"),
        (["--n-ctx", "99999"], "trained context"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, tiny_model, extra, msg):
    rc, err = _bad(capsys, ["bench", str(tiny_model), *extra])
    assert rc == 2 and len(err) == 1 and err[0].startswith("ondevice: error:") and msg in err[0], err


def test_bad_compare_input(capsys, tmp_path):
    foreign = tmp_path / "llama-bench.json"
    foreign.write_text(json.dumps([{"model_type": "llama 7B", "avg_ts": 10.0}]))
    for argv, msg in (
        (["bench", "compare", str(foreign), str(foreign)], "not an ondevice bench result"),
        (["bench", "compare", str(tmp_path / "none.json"), str(foreign)], "no such file"),
        (["bench", "compare"], "got 0"),
    ):
        rc, err = _bad(capsys, argv)
        assert rc == 2 and len(err) == 1 and msg in err[0], err


def test_unknown_model_is_bad_input(capsys):
    rc, err = _bad(capsys, ["bench", "no-such-model-anywhere", "--suite", "quick"])
    assert rc == 2 and len(err) == 1 and "unknown model" in err[0]


def test_failing_model_does_not_stop_the_others(tmp_path, capsys, tiny_model):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    out = tmp_path / "r.json"
    rc = main(
        [
            "bench",
            str(junk),
            str(tiny_model),
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "1",
            "--scenarios",
            "resident",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 1
    doc = json.loads(out.read_text())
    failed = [r for r in doc["results"] if r["model"] == "junk.gguf"]
    assert failed and failed[0]["failures"][0]["reason"]
    assert any(r["model"] == "tiny-f16.gguf" and r["ok_runs"] == 1 for r in doc["results"])
    assert "junk.gguf" in capsys.readouterr().out


@pytest.mark.parametrize("slo, rc", [("ttft_p95=1e-9", 1), ("itl_max=1e-9", 1), ("ttft_p95=60,tpot_p95=60", 0)])
def test_slo_verdict_sets_the_exit_status(tmp_path, capsys, tiny_model, slo, rc):
    out = tmp_path / "slo.json"
    got = main(
        [
            "bench",
            str(tiny_model),
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "2",
            "--scenarios",
            "resident",
            "--no-progress",
            "--slo",
            slo,
            "--json",
            str(out),
        ]
    )
    assert got == rc
    (r,) = json.loads(out.read_text())["results"]
    assert r["ok_runs"] == 2 and r["failures"] == []  # every run was ok: the SLO alone decides the status
    assert r["slo"]["passed"] is (rc == 0) and r["slo"]["good_share"] == (1.0 if rc == 0 else 0.0)
    assert ("SLO FAIL" in capsys.readouterr().out) is (rc == 1)


def test_ctrl_c_writes_what_was_gathered(tmp_path, capsys, tiny_model, monkeypatch):
    from ondevice.bench import scenarios

    real, calls = scenarios.request, {"n": 0}

    def interrupting(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:  # warm-up, two measured requests, then Ctrl-C
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(scenarios, "request", interrupting)
    out = tmp_path / "partial.json"
    rc = main(
        [
            "bench",
            str(tiny_model),
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "5",
            "--scenarios",
            "resident",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 130
    doc = json.loads(out.read_text())
    assert doc["record"]["incomplete"] is True
    assert doc["results"][0]["repeats"] == 3 and doc["results"][0]["ok_runs"] == 2
    assert doc["results"][0]["failures"][0]["status"] == "interrupted"
    assert "incomplete" in capsys.readouterr().err


# ---------- output files (issue 13) ----------

SMALL = ["-p", "8", "-n", "2", "-r", "1", "--warmup", "0", "--scenarios", "resident", "--no-progress"]


def _no_bench(monkeypatch):
    from ondevice.bench import runner

    def ran(*a, **k):
        raise AssertionError("the bench ran before its output files were checked")

    monkeypatch.setattr(runner, "plan_bench", ran)
    monkeypatch.setattr(runner, "run_bench", ran)


@pytest.mark.parametrize("flag", ["--json", "--csv", "--md"])
@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_output_that_is_not_a_regular_file_is_refused_before_the_run(
    tmp_path, capsys, tiny_model, monkeypatch, flag, kind
):
    _no_bench(monkeypatch)
    target = special_file(tmp_path, kind)
    before = file_kind(target)
    rc, err = _bad(capsys, ["bench", str(tiny_model), *SMALL, flag, str(target), "--force"])
    assert rc == 2 and len(err) == 1 and err[0].startswith("ondevice: error:") and "not a regular file" in err[0], err
    assert file_kind(target) == before


@pytest.mark.parametrize("case", ["missing_folder", "read_only", "exists", "same_file"])
def test_bad_output_is_refused_before_the_run(tmp_path, capsys, tiny_model, monkeypatch, case):
    _no_bench(monkeypatch)
    out, extra = tmp_path / "r.json", []
    if case == "missing_folder":
        out = tmp_path / "no" / "such" / "r.json"
    elif case == "read_only":
        if os.geteuid() == 0:  # root writes through permission bits: a read-only mount
            out = Path("/sys/r.json")
        else:
            (tmp_path / "ro").mkdir(mode=0o555)
            out = tmp_path / "ro" / "r.json"
    elif case == "exists":
        out.write_text("keep me")
    else:
        extra = ["--md", str(out)]
    rc, err = _bad(capsys, ["bench", str(tiny_model), *SMALL, "--json", str(out), *extra])
    assert rc == 2 and len(err) == 1 and err[0].startswith("ondevice: error:"), err
    assert {
        "missing_folder": "does not exist",
        "read_only": "not writable",
        "exists": "already exists; pass --force",
        "same_file": "same file",
    }[case] in err[0]
    assert out.read_text() == "keep me" if case == "exists" else not out.exists()


def test_existing_output_is_replaced_with_force(tmp_path, capsys, tiny_model):
    out = tmp_path / "r.json"
    out.write_text("old")
    assert main(["bench", str(tiny_model), *SMALL, "--json", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["results"]
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--force" in capsys.readouterr().out


def test_write_failure_after_the_run_keeps_the_results(tmp_path, capsys, tiny_model, monkeypatch):
    import errno

    from ondevice.bench import report

    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path / "cache"))

    out, md, real = tmp_path / "r.json", tmp_path / "r.md", report.write_json

    def disk_full(path, doc):  # the disk holding --json fills up during the run
        if Path(path) == out:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, doc)

    monkeypatch.setattr(report, "write_json", disk_full)
    rc = main(["bench", str(tiny_model), *SMALL, "--json", str(out), "--md", str(md)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "No space left on device" in err[0] and str(out) in err[0], err
    assert "tiny-f16.gguf" in captured.out or "resident" in captured.out  # the table was still shown
    kept = Path(err[0].rsplit(" ", 1)[-1])
    assert kept.is_file() and kept.is_relative_to(tmp_path / "cache")
    doc = json.loads(kept.read_text())
    assert doc["results"][0]["ok_runs"] == 1 and not out.exists() and md.is_file()
