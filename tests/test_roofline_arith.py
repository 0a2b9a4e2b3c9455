"""Roofline arithmetic on known shapes: exact figures, no timing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ondevice.api import predict
from ondevice.core.errors import InvalidParameterError, SpecError
from ondevice.gguf.spec import inspect
from ondevice.roofline import Calibration, Predictor, TimedPredictor, bits_per_weight, effective_gbs
from ondevice.roofline.prediction import NO_TTFT_GIVEN, NO_TTFT_HERE, memory_verdict, prefill_flops
from ondevice.roofline.spec import QUANT_MIXES, mix_bits_per_weight, mix_for, spec_from_flags
from tests.probe_fakes import fake_result, fake_timing

GB = 1e9


def llama8b(**kw):
    base = dict(params=8.03e9, quant="Q4_K_M", layers=32, kv_heads=8, head_dim=128)
    base.update(kw)
    return spec_from_flags(**base)


def test_bits_per_weight_from_gguf_table():
    assert bits_per_weight("Q4_0") == 4.5
    assert bits_per_weight("Q8_0") == 8.5
    assert bits_per_weight("F16") == 16.0
    assert bits_per_weight("Q6_K") == 8 * 210 / 256
    with pytest.raises(KeyError):
        bits_per_weight("Q9_9")


def test_quant_mix_shares_sum_to_one():
    for name, (mix, head) in QUANT_MIXES.items():
        assert math.isclose(sum(mix.values()), 1.0), name
        bits_per_weight(head)
    assert mix_bits_per_weight(mix_for("q4_k_m")[0]) == pytest.approx(4.5 * 0.855 + 6.5625 * 0.145)
    assert mix_for("Q4_K") == ({"Q4_K": 1.0}, "Q4_K")  # a plain tensor type
    with pytest.raises(SpecError, match="unknown quant 'Q7_X'"):
        mix_for("Q7_X")


def test_design_worked_check_8b_q4km_on_307():
    """docs/roofline.md: Llama 3.1 8B Q4_K_M (~4.9 GB) on 307 GB/s -> about 63 tok/s."""
    p = predict(llama8b(params=8.0e9), ctx=(1,), bandwidth_gbs=307, prompt_tokens=None)
    assert p.contexts[0].weight_bytes == pytest.approx(4.8e9, rel=0.01)
    assert 62 <= p.contexts[0].ceiling_tok_s <= 65
    assert p.bandwidth_source == "given" and not p.calibrated and p.contexts[0].predicted_tok_s is None


def test_flags_with_embedding_match_the_real_file():
    s = llama8b(vocab=128256, d_model=4096)
    assert s.weight_bytes == pytest.approx(4.92e9, rel=0.01)  # Meta-Llama-3.1-8B Q4_K_M tensors
    assert s.bytes_by_type["Q6_K"] > s.decode_bytes_by_type.get("Q4_K", 0) * 0.1
    assert s.decode_weight_bytes < s.weight_bytes  # the embedding is a row gather
    assert s.kv_bytes_per_token == 2 * 2 * 8 * 128 * 32
    tied = llama8b(vocab=128256, d_model=4096, tied=True)
    assert tied.decode_weight_bytes > s.decode_weight_bytes - s.bytes_by_type["Q6_K"]


def test_design_worked_check_bf16_16gb_on_3tbs():
    """8B model in bf16, 16 GB of weights, 3 TB/s -> a little over 5 ms per token."""
    s = spec_from_flags(params=8e9, quant="BF16", layers=32, kv_heads=8, head_dim=128)
    ceiling_s, _ = Predictor(s, Calibration("CUDA", ceiling_gbs=3000)).step_s(0)
    assert ceiling_s == pytest.approx(16e9 / 3000e9)


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(params=None), "--params"),
        (dict(layers=None, head_dim=None), "--layers, --head-dim"),
        (dict(quant="Q7"), "unknown quant"),
        (dict(params=-1), "--params must be positive"),
        (dict(params="lots"), "--params must be a number"),
        (dict(layers=0), "--layers must be a positive integer"),
        (dict(active_params=9e9), "exceeds --params"),
        (dict(vocab=10**6, d_model=8192), "leaves no block weights"),
    ],
)
def test_flag_spec_errors(kw, msg):
    with pytest.raises(SpecError, match=msg):
        llama8b(**kw)


def test_an_unlisted_weight_type_reads_like_the_nearest_in_bits_per_weight():
    cal = Calibration("CPU", ceiling_gbs=20, type_gbs={"Q4_0": 10.0, "Q8_0": 14.0, "F16": 16.0})
    assert effective_gbs("Q8_0", cal) == 14.0
    assert effective_gbs("Q4_K", cal) == 10.0  # 4.5 bpw, like Q4_0
    assert effective_gbs("Q6_K", cal) == 14.0  # 6.56 bpw: nearer 8.5 than 4.5
    assert effective_gbs("Q2_K", cal) == 10.0 and effective_gbs("F32", cal) == 16.0
    assert effective_gbs("NOT_A_TYPE", cal) == 10.0
    assert effective_gbs("Q4_0", Calibration("CPU", ceiling_gbs=20)) == 20


def test_analytic_predictor_exact_on_a_synthetic_file(tiny_model):
    spec = inspect(tiny_model)
    cal = Calibration("CPU", ceiling_gbs=20, type_gbs={"F16": 8.0, "F32": 4.0}, kv_gbs=5.0, t0_s=1e-4)
    pred = Predictor(spec, cal)
    for n in (0, 1, 100, 511):
        ceiling, predicted = pred.step_s(n)
        kv = spec.kv_read_bytes(n)
        assert pred.kv_read_bytes(n) == kv
        assert ceiling == pytest.approx((spec.decode_weight_bytes + kv) / 20e9, rel=1e-12)
        want = spec.decode_bytes_by_type["F16"] / 8e9 + spec.decode_bytes_by_type["F32"] / 4e9 + kv / 5e9 + 1e-4
        assert predicted == pytest.approx(want, rel=1e-12)
    assert pred.basis == "bound"
    with pytest.raises(ValueError):
        Predictor(spec, Calibration("CPU", ceiling_gbs=0))


def test_predictor_sliding_window_caps_kv(default_model):
    spec = inspect(default_model)  # gemma 3: 15 of 18 layers slide over 512 tokens
    pred = Predictor(spec, Calibration("CPU", ceiling_gbs=10))
    for n in (1, 511, 512, 513, 2048, 32768):
        assert pred.kv_read_bytes(n) == spec.kv_read_bytes(n)
    assert pred.kv_read_bytes(4096) - pred.kv_read_bytes(2048) == 2048 * 3 * spec.kv_bytes_per_token_by_layer[5]


def test_an_estimate_never_faster_than_the_ceiling(tiny_model):
    spec = inspect(tiny_model)
    fast = Calibration("CPU", ceiling_gbs=1, type_gbs={"F16": 1000.0}, source="estimate")  # above the bound
    ceiling, estimated = Predictor(spec, fast).step_s(64)
    assert estimated == ceiling


def test_prefill_flops_exact():
    s = llama8b(heads=32)
    p = 100
    attn = 32 * 4.0 * (32 * 128) * p * (p + 1) / 2
    assert prefill_flops(s, p) == pytest.approx(2.0 * s.n_params_matmul * p + attn)
    windowed = replace(s, sliding_window=16, swa_layers=tuple(range(32)))
    assert prefill_flops(windowed, p) == pytest.approx(
        2.0 * s.n_params_matmul * p + 32 * 4.0 * 4096 * (16 * 17 / 2 + (p - 16) * 16)
    )
    headed = llama8b(heads=32, vocab=128256, d_model=4096, tied=True)
    head = 128256 * 4096
    assert prefill_flops(headed, p) == pytest.approx(2.0 * (headed.n_params_matmul - head) * p + 2.0 * head + attn)


def test_memory_buffers_near_llama_cpp_figures(default_model):
    """llama.cpp reserves a 514.50 MiB compute buffer for the default model at n_ubatch 512, n_ctx 4096: a GPU takes
    it whole; the CPU writes only its activations (the engine keeps one token's logits)."""
    spec = inspect(default_model)
    gpu = memory_verdict(
        spec, n_ctx=4096, n_batch=512, available_bytes=None, where="VRAM", backend="CUDA", n_gpu_layers=19
    )
    cpu = memory_verdict(spec, n_ctx=4096, n_batch=512, available_bytes=None, where="RAM")
    assert gpu.device_bytes - gpu.kv_bytes - spec.weight_bytes < 514.5 * 2**20 * 1.05
    assert gpu.device_bytes - gpu.kv_bytes > spec.weight_bytes - spec.head_bytes + 514.5 * 2**20 * 0.95
    assert cpu.buffer_bytes < 150 * 2**20 and cpu.device_bytes == 0
    assert cpu.kv_bytes == gpu.kv_bytes == 72 * 2**20  # 12 MiB (3 global layers) + 60 MiB (15 window layers, in full)


def test_memory_verdict_thresholds():
    s = llama8b()
    need = memory_verdict(s, n_ctx=4096, n_batch=512, available_bytes=None, where="RAM").total_bytes
    assert need > s.weight_bytes + 4096 * s.kv_bytes_per_token
    v = memory_verdict(s, n_ctx=4096, n_batch=512, available_bytes=int(need / 0.8) + 1, where="RAM")
    assert v.total_bytes == need and v.verdict == "fits"
    assert memory_verdict(s, n_ctx=4096, n_batch=512, available_bytes=need, where="RAM").verdict == "tight"
    assert memory_verdict(s, n_ctx=4096, n_batch=512, available_bytes=need - 1, where="RAM").verdict == "does not fit"
    assert memory_verdict(s, n_ctx=4096, n_batch=512, available_bytes=None, where="VRAM").verdict == "unknown"


def test_predict_with_a_probe_and_the_models_timing(tiny_model):
    r, spec = fake_result(build="b"), inspect(tiny_model)
    timing = fake_timing(spec)
    p = predict(tiny_model, ctx=(16, 256), probe=r, prompt_tokens=64, timing=timing)
    assert p.calibrated and p.bandwidth_source == "measured" and p.bandwidth_gbs == r.ceiling_gbs
    pred = TimedPredictor(spec, r.calibration(), timing)
    for row in p.contexts:
        assert (row.ceiling_step_s, row.predicted_step_s) == pred.step_s(row.n_ctx)
    assert p.request.ttft_s == pred.ttft_s(64) and p.request.basis == "calibrated"
    assert p.ttft.compute_gflops == 100.0 and p.ttft.floor_s >= p.ttft.compute_s
    assert p.memory.where == "RAM" and p.memory.available_bytes == 8 * 10**9 and p.memory.verdict == "fits"
    assert p.to_dict()["contexts"][1]["n_ctx"] == 256


def test_predict_without_a_timing_is_the_bound_and_an_estimate(tiny_model):
    p = predict(inspect(tiny_model), ctx=(16,), probe=fake_result(build="b", full=False))
    assert not p.calibrated and p.contexts[0].predicted_tok_s is None and p.estimates
    assert any("not timed here" in n for n in p.notes)


def test_no_ttft_without_a_timing_or_a_compute_figure(tiny_model):
    # a first-contact probe measures no compute: a prefill would be its weight reads alone, no TTFT to show
    spec = inspect(tiny_model)
    quick = predict(spec, ctx=(16,), probe=fake_result(build="b", full=False), prompt_tokens=64, output_tokens=8)
    assert quick.request.ttft_s is None and quick.request.e2e_s is None and quick.request.decode_s > 0
    assert quick.ttft is None and NO_TTFT_HERE in quick.notes
    full = predict(spec, ctx=(16,), probe=fake_result(build="b"), prompt_tokens=64, output_tokens=8)
    assert full.request.ttft_s > 0 and NO_TTFT_HERE not in full.notes  # the compute figure's floor
    timed = predict(
        spec, ctx=(16,), probe=fake_result(build="b", full=False), prompt_tokens=64, timing=fake_timing(spec)
    )
    assert timed.request.ttft_s > 0 and NO_TTFT_HERE not in timed.notes
    given = predict(spec, ctx=(16,), probe=fake_result(build="b", full=False), bandwidth_gbs=50.0, prompt_tokens=8)
    assert given.request.ttft_s is None and NO_TTFT_GIVEN in given.notes and NO_TTFT_HERE not in given.notes
    assert "memory verdict is for this machine (its free memory)" in given.notes


def test_given_bandwidth_says_what_stays_this_machines(tiny_model):
    spec = inspect(tiny_model)
    p = predict(spec, ctx=(16,), probe=fake_result(build="b"), bandwidth_gbs=50.0, prompt_tokens=8)
    assert p.bandwidth_source == "given" and not p.calibrated and p.contexts[0].predicted_tok_s is None
    assert p.ttft.compute_gflops == 100.0  # the probe's compute: this machine's
    assert any("for this machine" in n for n in p.notes)
    alone = predict(spec, ctx=(16,), bandwidth_gbs=50.0, prompt_tokens=8)
    assert alone.ttft is None and not any("for this machine" in n for n in alone.notes)


@pytest.mark.parametrize(
    "kw, err, msg",
    [
        (dict(bandwidth_gbs=0), InvalidParameterError, "bandwidth must be positive"),
        (dict(bandwidth_gbs=-5), InvalidParameterError, "bandwidth must be positive"),
        (dict(bandwidth_gbs="fast"), InvalidParameterError, "bandwidth must be a number"),
        (dict(ctx=(128, 4096), bandwidth_gbs=10), InvalidParameterError, "beyond the model's trained context of 512"),
        (dict(ctx=(0,), bandwidth_gbs=10), InvalidParameterError, "context must be a positive integer"),
        (dict(ctx=(), bandwidth_gbs=10), InvalidParameterError, "at least one context"),
        (dict(prompt_tokens=-1, bandwidth_gbs=10), InvalidParameterError, "prompt tokens"),
    ],
)
def test_predict_bad_input(tiny_model, kw, err, msg):
    with pytest.raises(err, match=msg):
        predict(tiny_model, **{"ctx": (16,), **kw})


def test_predict_on_a_fresh_machine_measures_the_bandwidth_and_times_the_model_once(tiny_model, tmp_path, monkeypatch):
    from ondevice.probing import timing as timing_mod
    from ondevice.probing.plans import TimingPlan

    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("ondevice.probing.host.array_bytes_for", lambda *a, **k: 8 << 20)
    timed = []
    real = timing_mod.time_engine
    small = TimingPlan(chunks=(1, 4, 16), chain=2, short_prompt=8, decode_steps=4, batch=(2,), rounds=1)
    monkeypatch.setattr(timing_mod, "time_engine", lambda eng, plan, progress=None: timed.append(1) or real(eng, small))
    first = predict(tiny_model, ctx=(16,), prompt_tokens=32)
    assert first.calibrated and first.request.basis == "calibrated" and timed == [1]
    second = predict(tiny_model, ctx=(16,), prompt_tokens=32)
    assert second.contexts == first.contexts and timed == [1]  # both cached
