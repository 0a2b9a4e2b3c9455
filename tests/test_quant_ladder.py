"""The ladder: quantize each type (cached), predicted and measured speed, quality against the base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ondevice.quant.ladder import BenchPlan, parse_types, run_ladder, rung_path
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.cli.main import main
from ondevice.core.errors import QuantError
from ondevice.gguf.spec import inspect
from tests.probe_fakes import fake_result

WIDE = SynthConfig(d_model=256, n_head=4, n_head_kv=2, d_ff=512, n_layer=2, n_vocab=512, seed=5)
TYPES = "Q4_0,Q4_K_M,Q8_0,F16"


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    return build_synthetic_model(WIDE, tmp_path_factory.mktemp("ladder") / "wide.gguf")


def test_parse_types():
    assert parse_types("q4_0, Q8_0,q4_0,f16") == ["Q4_0", "Q8_0", "F16"]
    with pytest.raises(QuantError, match="unknown quantization type 'Q3'; valid types"):
        parse_types("Q4_0,Q3")
    with pytest.raises(QuantError, match="no quantization types"):
        parse_types(" , ")


def test_predicted_speeds_order_as_the_bytes_do(wide, tmp_path):
    ladder = run_ladder(wide, TYPES, cache_root=tmp_path, bench=None, with_quality=False, bandwidth_gbs=10.0)
    rungs = ladder.rungs
    assert [r.qtype for r in rungs] == TYPES.split(",")
    assert ladder.base_type == "F16" and [r.is_base for r in rungs] == [False, False, False, True]
    by_bytes = sorted(rungs, key=lambda r: r.decode_weight_bytes)
    assert [r.qtype for r in by_bytes] == ["Q4_0", "Q4_K_M", "Q8_0", "F16"]
    ceilings = [r.ceiling_tok_s for r in by_bytes]
    assert all(a > b for a, b in zip(ceilings, ceilings[1:]))  # fewer bytes, faster
    ctx = BenchPlan().mean_ctx
    for r in rungs:  # the pure ceiling is bandwidth / bytes per step (weights + KV at the bench context)
        step_bytes = r.decode_weight_bytes + inspect(r.path).kv_read_bytes(ctx)
        assert r.ceiling_tok_s == pytest.approx(10e9 / step_bytes, rel=1e-9)
        assert r.predicted_tok_s is None and r.decode_tok_s is None and r.ppl is None
    bpw = {r.qtype: r.bits_per_weight for r in rungs}
    assert bpw["Q4_0"] < bpw["Q8_0"] < bpw["F16"] and 4.5 <= bpw["Q4_K_M"] < bpw["Q8_0"]

    calibrated = run_ladder(
        wide, TYPES, cache_root=tmp_path, bench=None, with_quality=False, probe=fake_result(build="b")
    )
    assert all(r.cached for r in calibrated.rungs)  # each rung timed on this machine: a predicted speed for each
    assert all(r.predicted_tok_s and r.predicted_tok_s > 0 for r in calibrated.rungs)
    assert all(r.ttft_floor_s and r.ttft_floor_s > 0 for r in calibrated.rungs)
    assert "not timed" not in calibrated.prediction_note


def test_cache_is_reused_and_repaired(wide, tmp_path):
    first = run_ladder(wide, "Q8_0", cache_root=tmp_path, bench=None, with_quality=False, bandwidth_gbs=10.0)
    path = Path(first.rungs[0].path)
    assert path == rung_path(wide, "Q8_0", tmp_path) and not first.rungs[0].cached
    again = run_ladder(wide, "Q8_0", cache_root=tmp_path, bench=None, with_quality=False, bandwidth_gbs=10.0)
    assert again.rungs[0].cached
    path.write_bytes(path.read_bytes()[:1000])  # a damaged entry is made again
    fixed = run_ladder(wide, "Q8_0", cache_root=tmp_path, bench=None, with_quality=False, bandwidth_gbs=10.0)
    assert not fixed.rungs[0].cached and path.stat().st_size == first.rungs[0].file_bytes


def test_full_ladder_measures_speed_and_quality(tiny_model, tmp_path):
    ladder = run_ladder(
        tiny_model,
        "Q4_0,Q8_0,F16",
        cache_root=tmp_path,
        bench=BenchPlan(16, 8, 1, 2),
        quality_opts={"max_tokens": 1100, "n_threads": 2},
        bandwidth_gbs=10.0,
    )
    q4, q8, f16 = ladder.rungs
    for r in ladder.rungs:
        assert r.decode_tok_s and r.decode_tok_s > 0 and r.ttft_s and r.ttft_s > 0
        assert r.ppl and r.ppl > 1
    assert f16.is_base and f16.kl_mean == 0 and f16.top1_agreement == 1
    assert 0 < q8.kl_mean < q4.kl_mean and q8.top1_agreement >= q4.top1_agreement
    assert ladder.backend == "CPU" and ladder.quality_scored_tokens == 512
    assert json.loads(json.dumps(ladder.to_dict()))["rungs"][0]["qtype"] == "Q4_0"


def test_cli_ladder(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path / "cache"))
    args = [
        "ladder",
        str(tiny_model),
        "--types",
        "Q4_0,F16",
        "--no-bench",
        "--max-tokens",
        "600",
        "--bandwidth",
        "10",
        "--no-progress",
    ]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["qtype"] for r in data["rungs"]] == ["Q4_0", "F16"] and data["base_type"] == "F16"
    assert Path(data["rungs"][0]["path"]).is_relative_to(tmp_path / "cache")
    assert main(args + ["--md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| type | size | bpw | ceiling tok/s") and "| F16 (base) |" in md
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "F16 (base)" in out and "pure ceiling at a given 10 GB/s" in out
    assert main(["ladder", str(tiny_model), "--types", "Q4_0,BOGUS"]) == 2
    assert "valid types" in capsys.readouterr().err


def test_ladder_from_a_quantized_source_needs_permission(tiny_model, tmp_path, capsys):
    from ondevice.quant.quantize import quantize

    q8 = quantize(tiny_model, tmp_path / "q8.gguf", "Q8_0")
    with pytest.raises(QuantError, match="allow-requantize"):
        run_ladder(q8, "Q4_0", cache_root=tmp_path, bench=None, with_quality=False)
    ladder = run_ladder(
        q8, "Q4_0", cache_root=tmp_path, bench=None, with_quality=False, allow_requantize=True, bandwidth_gbs=5.0
    )
    assert ladder.source_quant == "Q8_0" and ladder.rungs[0].qtype == "Q4_0"
    assert main(["ladder", str(q8), "--types", "Q4_0", "--no-bench", "--no-quality"]) == 2
    assert "already quantized" in capsys.readouterr().err
