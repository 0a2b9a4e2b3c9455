"""Roofline arithmetic on known shapes: exact figures, no timing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ondevice.api import cached_predictor as default_predictor
from ondevice.api import predict
from ondevice.core.errors import InvalidParameterError, ProbeError, SpecError
from ondevice.gguf.spec import inspect
from ondevice.roofline import Calibration, Predictor, bits_per_weight, effective_gbs
from ondevice.roofline.prediction import memory_verdict, prefill_flops
from ondevice.roofline.spec import QUANT_MIXES, mix_bits_per_weight, mix_for, spec_from_flags
from tests.probe_fakes import fake_result

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
    """README (The roofline): Llama 3.1 8B Q4_K_M (~4.9 GB) on 307 GB/s -> about 63 tok/s."""
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


def test_effective_bandwidth_interpolates_in_bits_per_weight():
    cal = Calibration("CPU", ceiling_gbs=20, type_gbs={"Q4_0": 10.0, "Q8_0": 14.0, "F16": 16.0})
    assert effective_gbs("Q8_0", cal) == 14.0
    assert effective_gbs("Q4_K", cal) == 10.0  # 4.5 bpw, like Q4_0
    assert effective_gbs("Q5_0", cal) == pytest.approx(10.0 + 4.0 * (5.5 - 4.5) / 4.0)
    assert effective_gbs("Q2_K", cal) == 10.0  # below the lowest: clamped
    assert effective_gbs("F32", cal) == 16.0  # above the highest: clamped
    assert effective_gbs("NOT_A_TYPE", cal) == 10.0
    assert effective_gbs("Q4_0", Calibration("CPU", ceiling_gbs=20)) == 20


def test_predictor_exact_on_a_synthetic_file(tiny_model):
    spec = inspect(tiny_model)
    cal = Calibration(
        "CPU", ceiling_gbs=20, type_gbs={"F16": 8.0, "F32": 4.0}, kv_gbs=5.0, t0_s=1e-4, layer_s=1e-5, vocab_s=1e-9
    )
    pred = Predictor(spec, cal)
    for n in (0, 1, 100, 511):
        ceiling, calibrated = pred.step_s(n)
        kv = spec.kv_read_bytes(n)
        assert pred.kv_read_bytes(n) == kv
        assert ceiling == pytest.approx((spec.decode_weight_bytes + kv) / 20e9, rel=1e-12)
        want = (
            spec.decode_bytes_by_type["F16"] / 8e9
            + spec.decode_bytes_by_type["F32"] / 4e9
            + kv / 5e9
            + 1e-4
            + 2 * 1e-5
            + 512 * 1e-9
        )
        assert calibrated == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError):
        Predictor(spec, Calibration("CPU", ceiling_gbs=0))


def test_predictor_sliding_window_caps_kv(default_model):
    spec = inspect(default_model)  # gemma 3: 15 of 18 layers slide over 512 tokens
    pred = Predictor(spec, Calibration("CPU", ceiling_gbs=10))
    for n in (1, 511, 512, 513, 2048, 32768):
        assert pred.kv_read_bytes(n) == spec.kv_read_bytes(n)
    assert pred.kv_read_bytes(4096) - pred.kv_read_bytes(2048) == 2048 * 3 * spec.kv_bytes_per_token_by_layer[5]


def test_calibrated_never_faster_than_ceiling(tiny_model):
    spec = inspect(tiny_model)
    fast = Calibration("CPU", ceiling_gbs=1, type_gbs={"F16": 1000.0})  # a fit above the bound
    ceiling, calibrated = Predictor(spec, fast).step_s(64)
    assert calibrated == ceiling


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


def test_predict_with_a_probe(tiny_model):
    r = fake_result(build="b")
    p = predict(tiny_model, ctx=(16, 256), probe=r, prompt_tokens=64)
    assert p.calibrated and p.bandwidth_source == "measured" and p.bandwidth_gbs == r.ceiling_gbs
    pred = Predictor(inspect(tiny_model), r.calibration())
    for row in p.contexts:
        assert (row.ceiling_step_s, row.predicted_step_s) == pred.step_s(row.n_ctx)
        assert row.predicted_tok_s <= row.ceiling_tok_s
    assert p.ttft.compute_gflops == 100.0 and p.ttft.floor_s >= p.ttft.compute_s
    assert p.memory.where == "RAM" and p.memory.available_bytes == 8 * 10**9 and p.memory.verdict == "fits"
    assert p.to_dict()["contexts"][1]["n_ctx"] == 256


def test_predict_without_kernel_probe_is_ceiling_only(tiny_model):
    p = predict(tiny_model, ctx=(16,), probe=fake_result(build="b", kernel=False))
    assert not p.calibrated and p.contexts[0].predicted_tok_s is None
    assert any("ondevice probe" in n for n in p.notes)


def test_given_bandwidth_says_what_stays_this_machines(tiny_model):
    p = predict(tiny_model, ctx=(16,), probe=fake_result(build="b"), bandwidth_gbs=50.0, prompt_tokens=8)
    assert p.bandwidth_source == "given" and not p.calibrated and p.contexts[0].predicted_tok_s is None
    assert p.ttft.compute_gflops == 100.0  # the probe's compute: this machine's
    assert any("for this machine" in n for n in p.notes)
    alone = predict(tiny_model, ctx=(16,), bandwidth_gbs=50.0, prompt_tokens=8)
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


def test_predict_without_probe_or_bandwidth_needs_a_cache(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ProbeError, match="ondevice probe"):
        predict(tiny_model, ctx=(16,))


def test_default_predictor_uses_only_the_cache(tiny_model, tmp_path, monkeypatch):
    from ondevice.probing import cache

    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    spec = inspect(tiny_model)
    assert default_predictor(spec, "CPU") is None  # nothing cached: no probe is run
    cache.save(fake_result(build=cache.build_id()))
    pred = default_predictor(spec, "CPU")
    assert isinstance(pred, Predictor) and pred.calibration.t0_s == 1e-4
    assert default_predictor(spec, "CUDA") is None  # another backend's results do not apply
    assert predict(spec, ctx=(32,)).calibrated  # the API reads the same cache


def test_attention_scores_exact(tiny_model, default_model):
    from ondevice.roofline import attention_scores

    tiny = inspect(tiny_model)  # 2 layers, 4 query heads
    assert attention_scores(tiny, 100) == 2 * 100 * 4
    gemma = inspect(default_model)  # 18 layers, 4 heads; 15 layers slide over 512 tokens
    assert attention_scores(gemma, 300) == 18 * 300 * 4
    assert attention_scores(gemma, 4096) == (3 * 4096 + 15 * 512) * 4
    assert attention_scores(gemma, 4096, windowed=False) == 18 * 4096 * 4
    assert attention_scores(replace(gemma, n_head=None), 4096) == 0


def test_predictor_attention_term(tiny_model):
    from ondevice.roofline import attention_scores

    spec = inspect(tiny_model)
    base = Calibration("CPU", ceiling_gbs=20, type_gbs={"F16": 8.0}, t0_s=1e-4)
    with_attn = replace(base, attn_score_s=((32, 1e-9),))
    for n in (1, 300):
        _, a = Predictor(spec, base).step_s(n)
        _, b = Predictor(spec, with_attn).step_s(n)
        assert b - a == pytest.approx(attention_scores(spec, n) * 1e-9, rel=1e-9)


def test_predictor_prices_a_score_by_its_head(tiny_model, default_model):
    """Per score, the probe's table at the model's key + value dims (gemma's 256 + 256, the tiny
    model's 16 + 16): its own entry, or linear between the two nearest."""
    from ondevice.roofline import attention_head_dims, attention_scores, score_s

    gemma, tiny = inspect(default_model), inspect(tiny_model)
    assert attention_head_dims(gemma) == 512 and attention_head_dims(tiny) == 2 * tiny.head_dim_k == 32
    table = ((16, 1e-9), (48, 3e-9), (512, 2e-9))
    base = Calibration("CPU", ceiling_gbs=20, type_gbs={"F16": 8.0, "Q8_0": 8.0})
    timed = replace(base, attn_score_s=table)
    for spec, per_score in ((tiny, 2e-9), (gemma, 2e-9)):  # 32 dims: halfway from 16 to 48; 512: its own
        assert score_s(table, attention_head_dims(spec)) == pytest.approx(per_score)
        for n in (1, 300):
            _, a = Predictor(spec, base).step_s(n)
            _, b = Predictor(spec, timed).step_s(n)
            assert b - a == pytest.approx(attention_scores(spec, n) * per_score, rel=1e-9)


def test_sliding_windows_count_the_window_unless_the_runtime_reads_every_cell(default_model):
    """llama.cpp keeps every token in sliding-window layers (swa_full) but skips the masked cells: the
    calibrated terms count the window by default; swa_full=True spans it all; the ceiling counts the window."""
    from ondevice.roofline import attention_scores

    spec = inspect(default_model)
    cal = Calibration("CPU", ceiling_gbs=10, type_gbs={"Q8_0": 5.0}, kv_gbs=4.0, attn_score_s=((512, 1e-10),))
    n = 4096
    masked, windowed = Predictor(spec, replace(cal, swa_full=True)), Predictor(spec, cal)
    base = masked.step_s(0)[1]
    assert masked.step_s(n)[1] - base == pytest.approx(
        n * spec.kv_bytes_per_token / 4e9 + attention_scores(spec, n, windowed=False) * 1e-10, rel=1e-9
    )
    assert windowed.step_s(n)[1] - base == pytest.approx(
        spec.kv_read_bytes(n) / 4e9 + attention_scores(spec, n) * 1e-10, rel=1e-9
    )
    assert (
        masked.step_s(n)[0]
        == windowed.step_s(n)[0]
        == pytest.approx((spec.decode_weight_bytes + spec.kv_read_bytes(n)) / 10e9)
    )


def test_each_matrix_row_costs_its_set_up(default_model):
    """row_s per row of every matrix-vector product, the head's n_vocab rows included: Gemma 3 270M
    computes 386,560 a token; a prefill chunk keeps the head's rows for its last token only."""
    spec = inspect(default_model)
    assert sum(spec.decode_rows_by_type.values()) == 386_560 and spec.decode_rows_by_type["Q8_0"] >= spec.n_vocab
    base = Calibration("CPU", ceiling_gbs=40, type_gbs={"Q8_0": 30.0, "Q4_K": 30.0, "F16": 30.0})
    rowed = replace(base, row_s=5e-9)
    for n in (1, 1000):
        assert Predictor(spec, rowed).step_s(n)[1] - Predictor(spec, base).step_s(n)[1] == pytest.approx(386_560 * 5e-9)
    assert Predictor(spec, rowed).prefill_s(1) - Predictor(spec, base).prefill_s(1) == pytest.approx(386_560 * 5e-9)


def test_rows_narrower_than_the_probes_pay_the_batched_row_cost_per_row_and_token(default_model):
    """Every token of a chunk past the first costs batch_row_s per body row beyond what rows of
    batch_row_width weights would hold (the head runs for the chunk's last token only), within the
    measured step ratios and past them alike; rows as long as the probe's sized ones pay nothing."""
    from ondevice.roofline import bits_per_weight

    spec = inspect(default_model)
    base = Calibration(
        "CPU",
        ceiling_gbs=40,
        type_gbs={"Q8_0": 30.0},
        type_gflops={"Q8_0": 100.0},
        step_ratios={"Q8_0": ((2, 1.5), (16, 3.0))},
        batch_row_width=2446.0,
    )
    rowed = replace(base, batch_row_s=2e-9)
    body_rows = sum(spec.decode_rows_by_type.values()) - spec.n_vocab
    body_weights = sum(
        b * 8 / bits_per_weight(t) for t, b in spec.decode_bytes_by_type.items() if spec.decode_rows_by_type.get(t)
    ) - spec.head_bytes * 8 / bits_per_weight(spec.head_type)
    excess = body_rows - body_weights / 2446.0
    assert 0 < excess < body_rows  # Gemma 3 270M's rows (640 wide) are shorter than the probe's
    for n in (1, 16, 512):
        extra = Predictor(spec, rowed).prefill_s(n) - Predictor(spec, base).prefill_s(n)
        assert extra == pytest.approx((n - 1) * 2e-9 * excess, rel=1e-9, abs=1e-15)
    every_row = replace(rowed, batch_row_width=0.0)  # no width: every row pays
    assert Predictor(spec, every_row).prefill_s(16) - Predictor(spec, replace(base, batch_row_width=0.0)).prefill_s(
        16
    ) == pytest.approx(15 * 2e-9 * body_rows, rel=1e-9)
    wide = replace(rowed, batch_row_width=body_weights / body_rows)  # rows as long as the sized ones: nothing more
    assert Predictor(spec, wide).prefill_s(512) == pytest.approx(Predictor(spec, base).prefill_s(512), rel=1e-12)


def test_repacked_types_pay_no_batched_row_cost(default_model):
    """A weight type the probe saw llama.cpp repack (CPU_REPACK's tiled kernels) is not charged the
    per-row cost the narrow Q8_0 model measured on the plain kernels; the other types still are."""
    spec = inspect(default_model)  # Q8_0, Q5_0, Q4_K and Q6_K matrices of 640-wide rows
    base = Calibration(
        "CPU",
        ceiling_gbs=40,
        type_gbs={"Q8_0": 30.0},
        type_gflops={"Q8_0": 100.0},
        step_ratios={"Q8_0": ((2, 1.5), (16, 3.0))},
        batch_row_width=2446.0,
    )
    rowed = replace(base, batch_row_s=2e-9)
    extra = Predictor(spec, rowed).prefill_s(16) - Predictor(spec, base).prefill_s(16)
    spared = replace(rowed, repacked_types=("Q4_K",))
    extra_spared = Predictor(spec, spared).prefill_s(16) - Predictor(spec, base).prefill_s(16)
    q4k_rows, q4k_weights = spec.decode_rows_by_type["Q4_K"], spec.decode_bytes_by_type["Q4_K"] * 8 / 4.5
    assert extra - extra_spared == pytest.approx(15 * 2e-9 * (q4k_rows - q4k_weights / 2446.0), rel=1e-6)
    every = replace(rowed, repacked_types=tuple(spec.decode_bytes_by_type))
    assert Predictor(spec, every).prefill_s(16) == pytest.approx(Predictor(spec, base).prefill_s(16), rel=1e-12)
