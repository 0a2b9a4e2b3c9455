"""benchmarks/device_check.py: its parsing and summary on recorded outputs, and its steps end to end on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import device_check

ROOT = Path(__file__).parents[1]
DEVICE = Path(__file__).parent / "data" / "device"


@pytest.fixture(scope="module")
def check():
    return device_check


def test_one_cuda_architecture_from_nvidia_smi(check):
    assert check.parse_compute_caps((DEVICE / "nvidia_smi_h200_query.csv").read_text()) == ["90"]
    assert check.parse_compute_caps((DEVICE / "nvidia_smi_two_caps.csv").read_text()) == ["89", "86"]
    assert check.parse_compute_caps("No devices were found\n") == []
    assert check.parse_compute_caps("") == []


def test_bench_rows_hold_measured_beside_predicted(check):
    rows = check.bench_rows(json.loads((ROOT / "tests" / "data" / "bench" / "same.json").read_text()))
    assert rows and rows[0]["decode_tok_s"] == pytest.approx(2019.301775284193)
    assert rows[0]["predicted_tok_s"] == pytest.approx(220.2905035023802) and rows[0]["scenario"] == "resident"
    assert check.bench_rows({}) == []


def test_summary_names_every_step_and_the_figures(check):
    doc = {
        "elapsed_s": 312.4,
        "steps": [
            {"step": "build", "status": "ok", "seconds": 241.0, "note": "built in 241.0 s"},
            {"step": "probe", "status": "timeout", "seconds": 240.0, "detail": "over 240 s"},
            {"step": "tests", "status": "skipped", "detail": "12 s left before the deadline"},
        ],
        "facts": {
            "gpu": "NVIDIA H200, 143771, 143156, 580.159.04, 9.0",
            "arch": "90",
            "bench": [
                dict(
                    model="m.gguf",
                    scenario="resident",
                    workload="p128_n64",
                    decode_tok_s=512.0,
                    predicted_tok_s=480.0,
                    efficiency=1.07,
                    ttft_s=0.02,
                    predicted_ttft_s=0.018,
                )
            ],
        },
    }
    text = check.summary(doc)
    assert "device check: 312 s" in text and "build      ok" in text and "probe      timeout" in text
    assert "tests      skipped" in text and "arch: 90" in text
    assert "decode 512.0 tok/s (predicted 480.0, eff 1.07), TTFT 20.0 ms (predicted 18.0)" in text


def test_a_failed_step_is_recorded_and_the_next_runs(check, tmp_path):
    c = check.Check(tmp_path, 600, {})
    c.step("bad", 10, lambda budget: 1 / 0)
    c.step("slow", 10, lambda budget: c.sh([sys.executable, "-c", "import time; time.sleep(5)"], 0.5))
    c.step("good", 10, lambda budget: {"note": "fine"})
    doc = json.loads((tmp_path / "device_check.json").read_text())
    assert [s["status"] for s in doc["steps"]] == ["failed", "timeout", "ok"]
    assert "ZeroDivisionError" in doc["steps"][0]["detail"] and (tmp_path / "summary.txt").exists()
    late = check.Check(tmp_path, 0, {})
    late.step("never", 60, lambda budget: {"note": "ran"})
    assert late.steps[0]["status"] == "skipped"


def test_cpu_mode_end_to_end(tmp_path, user_dirs):
    """The script's own path on this machine: its steps on a tiny model (no build, no GPU)."""
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.device_check",
            "--cpu",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--steps",
            "gpu,system,model,run,info,fit",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "device_check.json").read_text())
    assert [s["step"] for s in doc["steps"]] == ["gpu", "system", "model", "run", "info", "fit"]
    facts = doc["facts"]
    assert "TTFT" in facts["run_line"] and facts["info"]["n_layer"] == 2
    assert facts["run_buffers"]["lines"] and facts["fit_line"].startswith("ondevice: --fit: context 512")
    assert "run        ok" in (out / "summary.txt").read_text()
