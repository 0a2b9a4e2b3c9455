"""Predicted TTFT, E2E and multi-token steps: the source articles' worked timelines, the
prefill arithmetic by hand, and the measured attribution of a real request adding up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ondevice.core.results import Timings
from ondevice.roofline import Calibration, Predictor, bits_per_weight, causal_spans, effective_gbs, effective_gflops
from ondevice.roofline.prediction import request_prediction
from ondevice.roofline.spec import spec_from_flags

GB = 1e9


class _Timeline:
    """A stand-in predictor with a fixed prefill time and a flat decode step (the seeds' scenarios)."""

    def __init__(self, ttft_s: float, step_s: float):
        self._ttft, self._step = ttft_s, step_s

    def ttft_s(self, n_prompt, n_cached=0, n_batch=512):
        return self._ttft

    def decode_s(self, n_prompt, n_output):
        return (n_output - 1) * self._step


def test_seed_timeline_measured_side():
    """Seed 3: first token at 0.8 s, the 101st and last at 2.8 s: TPOT 20 ms (50 tok/s decode),
    output throughput 101 / 2.8 = 36.1 tok/s: two different numbers."""
    t = Timings(
        tokenize_s=0.0,
        prefill_s=0.8,
        ttft_s=0.8,
        itl_s=(0.02,) * 100,
        e2e_s=2.8,
        prompt_tokens_computed=10,
        output_tokens=101,
    )
    assert t.tpot_s == pytest.approx(0.02) and t.decode_tok_s == pytest.approx(50.0)
    assert t.output_throughput_tok_s == pytest.approx(36.07, abs=0.01)


def test_seed_scenarios_prefill_share():
    """Seed 0: chat (200 prompt, 800 output: prefill 6 ms, 799 steps of ~5.4 ms = 4.3 s) waits
    0.1% on prefill; document QA (65k prompt, 150 output: TTFT 4.3 s, 149 steps of 8 ms) 78%."""
    chat = request_prediction(_Timeline(0.006, 0.0054), 200, 800, calibrated=True)
    assert chat.decode_s == pytest.approx(4.3146) and chat.e2e_s == pytest.approx(4.3206)
    assert round(100 * chat.prefill_share, 1) == 0.1 and chat.tpot_s == pytest.approx(0.0054)
    assert chat.output_tok_s == pytest.approx(800 / 4.3206)
    doc = request_prediction(_Timeline(4.3, 0.008), 65_000, 150, calibrated=True)
    assert doc.decode_s == pytest.approx(1.192) and round(100 * doc.prefill_share) == 78
    only = request_prediction(_Timeline(4.3, 0.008), 65_000, None, calibrated=False)
    assert only.e2e_s is None and only.prefill_share is None and only.basis == "bound"


def _cal(**kw) -> Calibration:
    base = dict(
        backend="CPU",
        ceiling_gbs=100.0,
        type_gbs={"Q4_K": 50.0, "Q6_K": 60.0, "F16": 80.0},
        kv_gbs=80.0,
        t0_s=1e-4,
        layer_s=1e-5,
        vocab_s=1e-9,
        type_gflops={"Q4_K": 200.0, "Q6_K": 150.0, "F16": 100.0},
        attn_gflops=50.0,
    )
    base.update(kw)
    return Calibration(**base)


def _spec():
    return spec_from_flags(
        params=8.03e9,
        quant="Q4_K_M",
        layers=32,
        kv_heads=8,
        head_dim=128,
        heads=32,
        d_model=4096,
        vocab=128256,
        ctx_train=8192,
    )


def test_causal_spans():
    assert causal_spans(0, 4) == 1 + 2 + 3 + 4
    assert causal_spans(2, 4) == 3 + 4
    assert causal_spans(0, 6, window=3) == 1 + 2 + 3 + 3 + 3 + 3
    assert causal_spans(4, 6, window=3) == 3 + 3


def test_one_token_step_is_the_decode_step():
    pred = Predictor(_spec(), _cal())
    for s in (1, 100, 4000):
        assert pred.tokens_step_s(s, 1, 1) == pytest.approx(pred.step_s(s)[1])
        assert pred.ceiling_tokens_step_s(s, 1, 1) == pytest.approx(pred.step_s(s)[0])


def test_more_tokens_per_step_cost_their_compute():
    spec, cal = _spec(), _cal()
    pred = Predictor(spec, cal)
    elements = {t: b * 8 / bits_per_weight(t) for t, b in spec.decode_bytes_by_type.items()}
    token_s = sum(2 * n / (effective_gflops(t, cal) * GB) for t, n in elements.items())
    two = pred.tokens_step_s(1000, 2) - pred.tokens_step_s(1000, 1)
    attn = 2 * 32 * 256 * 32 * 1002 / (50.0 * GB)  # the second token (position 1001) attends 1002 tokens, 32 layers
    assert two == pytest.approx(token_s + attn + spec.n_vocab * cal.vocab_s, rel=1e-9)
    # a batch of B sequences reads every sequence's KV: B - 1 more reads than one sequence
    b4 = pred.tokens_step_s(1000, 1, 4) - pred.tokens_step_s(1000, 1, 1)
    assert b4 == pytest.approx(
        3 * (token_s + attn - 2 * 32 * 256 * 32 / (50.0 * GB) + spec.n_vocab * cal.vocab_s)
        + 3 * pred.kv_read_bytes(1000) / (80 * GB),
        rel=1e-3,
    )
    assert pred.ceiling_tokens_step_s(1000, 1, 4) == pytest.approx(
        (spec.decode_weight_bytes + 4 * pred.kv_read_bytes(1000)) / (100 * GB)
    )
    fast = Predictor(spec, _cal(type_gflops={"Q4_K": 20000.0}, attn_gflops=5000.0))  # a GPU's compute
    assert fast.tokens_step_s(1000, 8) < 1.2 * fast.tokens_step_s(1000, 1)  # the weights are read once


def test_prefill_by_hand_in_chunks():
    """Two chunks of 512: each reads the weights once and computes its tokens; the head once."""
    spec = _spec()
    cal = _cal(attn_gflops=1e30)  # attention free, to check the rest by hand
    pred = Predictor(spec, cal)
    elements = {t: b * 8 / bits_per_weight(t) for t, b in spec.decode_bytes_by_type.items()}
    token_s = sum(2 * n / (effective_gflops(t, cal) * GB) for t, n in elements.items())
    mean_gflops = sum(elements.values()) / sum(n / effective_gflops(t, cal) for t, n in elements.items())
    head_s = 2 * 128256 * 4096 / (mean_gflops * GB)
    weights_s = sum(b / (effective_gbs(t, cal) * GB) for t, b in spec.decode_bytes_by_type.items())
    fixed_s = cal.t0_s + 32 * cal.layer_s
    head_read_s = spec.head_bytes / (effective_gbs(spec.head_type, cal) * GB)  # the first chunk keeps no logits
    expected = (
        2 * (weights_s + fixed_s)
        - head_read_s
        + 1022 * (token_s - head_s)
        + pred.kv_read_bytes(512) / (80 * GB)
        + 128256 * cal.vocab_s
    )
    assert pred.prefill_s(1024, n_batch=512) == pytest.approx(expected, rel=1e-9)
    one_chunk = weights_s + fixed_s + 1023 * (token_s - head_s) + 128256 * cal.vocab_s
    assert pred.prefill_s(1024, n_batch=1024) == pytest.approx(one_chunk, rel=1e-9)
    assert pred.prefill_s(0) == 0.0


def test_ttft_counts_only_what_the_cache_lacks():
    pred = Predictor(_spec(), _cal())
    assert pred.ttft_s(1000, 0) == pytest.approx(pred.prefill_s(1000, 0))
    assert pred.ttft_s(1000, 600) == pytest.approx(pred.prefill_s(400, 600))
    assert pred.ttft_s(1000, 1000) == pytest.approx(pred.prefill_s(1, 999))  # the last token is always computed
    assert pred.ttft_s(1000, 600) < pred.ttft_s(1000, 0)


def test_e2e_is_ttft_plus_the_growing_steps():
    pred = Predictor(_spec(), _cal())
    e2e = pred.e2e_s(500, 64)
    assert e2e == pytest.approx(pred.ttft_s(500) + sum(pred.step_s(500 + i)[1] for i in range(1, 64)))
    assert pred.decode_s(500, 1) == 0.0


def test_uncalibrated_prefill_uses_the_host_compute():
    pred = Predictor(_spec(), Calibration("CPU", ceiling_gbs=100.0, compute_gflops=300.0))
    faster = Predictor(_spec(), Calibration("CPU", ceiling_gbs=100.0, compute_gflops=600.0))
    assert faster.prefill_s(2048) < pred.prefill_s(2048)
    none = Predictor(_spec(), Calibration("CPU", ceiling_gbs=100.0))
    assert none.prefill_s(2048) < pred.prefill_s(2048)  # no compute figure: the weight reads only


def test_gflops_interpolate_in_time_per_flop():
    cal = _cal(type_gflops={"Q4_0": 100.0, "Q8_0": 50.0})
    assert effective_gflops("Q4_0", cal) == 100.0
    mid = effective_gflops("Q6_K", cal)  # 6.5625 bpw: 51.6% of the way from 4.5 to 8.5 bits
    f = (6.5625 - 4.5) / 4.0
    assert 1 / mid == pytest.approx((1 - f) / 100.0 + f / 50.0)
    assert effective_gflops("Q4_0", replace(cal, type_gflops={}, compute_gflops=None)) is None


# ---- a real request: predicted TTFT/E2E beside measured, the attribution adds up ----


def test_generation_carries_predictions_and_an_attribution(tiny_model):
    from ondevice.engine import load
    from ondevice.gguf.spec import inspect

    spec = inspect(tiny_model)
    pred = Predictor(spec, _cal(type_gbs={"F16": 10.0}, type_gflops={"F16": 20.0}))
    with load(tiny_model, n_ctx=256, predictor=pred) as eng:
        g = eng.generate([1, 5, 9, 13, 17, 21], max_tokens=6, ignore_eos=True, seed=0)
        assert g.predicted_ttft_s == pytest.approx(pred.ttft_s(6, 0, min(eng.info.n_batch, eng.info.n_ubatch)))
        assert g.predicted_e2e_s == pytest.approx(g.predicted_ttft_s + sum(g.predicted_step_s[1:]))
        assert g.predicted_output_tok_s == pytest.approx(6 / g.predicted_e2e_s)
        a = g.attribution
        parts = [a.tokenize_s, a.prefill_s, a.first_sample_s, a.decode_s, a.sample_s, a.detokenize_s, a.consumer_s]
        assert all(p >= 0 for p in parts) and a.overhead_s > -1e-6
        assert sum(parts) + a.overhead_s == pytest.approx(g.timings.e2e_s, abs=1e-9)
        assert a.prefill_s == g.timings.prefill_s and a.decode_s > 0 and a.sample_s > 0
        assert sum(a.shares().values()) == pytest.approx(1.0)
        d = g.to_dict()
        assert d["attribution"]["e2e_s"] == a.e2e_s and d["predicted_ttft_s"] == g.predicted_ttft_s
        # a prefix hit: the prediction counts only the tokens computed
        h = eng.generate([1, 5, 9, 13, 17, 21, 25], max_tokens=2, ignore_eos=True, seed=0)
        assert h.cached_prompt_tokens == 6
        assert h.predicted_ttft_s == pytest.approx(pred.ttft_s(7, 6, min(eng.info.n_batch, eng.info.n_ubatch)))


def test_consumer_time_is_attributed_to_the_consumer(tiny_model):
    import time

    from ondevice.engine import load

    with load(tiny_model, n_ctx=256, predictor=None) as eng:
        stream = eng.stream([1, 5, 9], max_tokens=4, ignore_eos=True, seed=0)
        for _ in stream:
            time.sleep(0.02)
        g = stream.generation
    assert g.attribution.consumer_s >= 3 * 0.02 * 0.9  # three gaps inside E2E (the last token ends it)
    assert g.predicted_ttft_s is None and g.predicted_e2e_s is None


# ---- a working set the caches hold ----

CURVE = ((2 << 20, 100.0), (16 << 20, 90.0), (64 << 20, 40.0), (256 << 20, 30.0))  # bytes, GB/s


def test_read_speedup_interpolates_in_log_bytes():
    from ondevice.roofline import read_speedup

    assert read_speedup(CURVE, 1 << 20) == pytest.approx(100 / 30)  # below the smallest: the smallest's
    assert read_speedup(CURVE, 16 << 20) == pytest.approx(3.0)
    assert read_speedup(CURVE, 32 << 20) == pytest.approx((90 + (40 - 90) * 0.5) / 30)  # halfway in log
    assert read_speedup(CURVE, 200 << 20) == 1.0  # within 10% of DRAM: drift, not a cache
    assert read_speedup(CURVE, 1 << 30) == 1.0 and read_speedup((), 1 << 20) == 1.0


def test_monotone_curve_and_best_of_two():
    from ondevice.probing.readcurve import best_curve, curve_sizes, monotone

    assert monotone([(1, 50.0), (2, 60.0), (4, 20.0), (8, 25.0)]) == ((1, 60.0), (2, 60.0), (4, 25.0), (8, 25.0))
    assert best_curve(((1, 10.0), (2, 5.0)), ((1, 8.0), (2, 6.0))) == ((1, 10.0), (2, 6.0))
    sizes = curve_sizes(10 << 20)
    assert sizes[::2] == [2 << 20, 4 << 20, 8 << 20] and sizes[-1] == 10 << 20  # sqrt(2) steps, then DRAM's size
    assert sizes[1] == int((2 << 20) * 2**0.5) // 65536 * 65536 and len(sizes) == 6
    assert all(b / a < 1.43 for a, b in zip(sizes, sizes[1:-1]))


def test_a_cache_resident_model_is_predicted_faster_and_so_is_its_ceiling():
    from ondevice.roofline.spec import spec_from_flags

    small = spec_from_flags(params=20e6, quant="Q4_0", layers=4, kv_heads=2, head_dim=64)  # ~11 MB
    big = _spec()
    for spec, faster in ((small, True), (big, False)):
        plain, cached = Predictor(spec, _cal()), Predictor(spec, _cal(read_curve=CURVE))
        (c0, p0), (c1, p1) = plain.step_s(64), cached.step_s(64)
        assert (p1 < p0) is faster and (c1 < c0) is faster
        assert cached.tokens_step_s(64, 1) == pytest.approx(p1)


def test_measured_step_ratios_price_several_tokens_per_decode():
    """With the probe's step ratios, n tokens in one decode cost each weight type's ratio at n
    columns (the head too when every token keeps its logits; one column in a prefill)."""
    ratios = {
        "Q4_K": ((2, 2.0), (4, 2.5), (16, 4.0)),
        "Q6_K": ((2, 1.5), (4, 2.0), (16, 3.0)),
        "F16": ((2, 1.2), (4, 1.4), (16, 2.0)),
    }
    spec = _spec()
    cal = _cal(step_ratios=ratios, attn_gflops=1e30)
    pred = Predictor(spec, cal)
    read = {t: b / (effective_gbs(t, cal) * GB) for t, b in spec.decode_bytes_by_type.items()}
    table = {"Q4_K": 2.0, "Q6_K": 1.5, "F32": 1.2}  # F32 (norms) borrows F16's, the nearest in bits
    two = sum(r * table[t] for t, r in read.items()) - sum(read.values())
    assert pred.tokens_step_s(100, 2) - pred.step_s(100)[1] == pytest.approx(two + 128256 * cal.vocab_s, rel=1e-9)
    three = {"Q4_K": 2.25, "Q6_K": 1.75, "F32": 1.3}  # linear between 2 and 4
    assert pred.tokens_step_s(100, 3) - pred.step_s(100)[1] == pytest.approx(
        sum(r * three[t] for t, r in read.items()) - sum(read.values()) + 2 * 128256 * cal.vocab_s, rel=1e-9
    )
    head_s = spec.head_bytes / (effective_gbs("Q6_K", cal) * GB)
    # a one-chunk prefill of 4 tokens: the body over 4 columns, the head over one
    four = {"Q4_K": 2.5, "Q6_K": 2.0, "F32": 1.4}
    body = sum(r * four[t] for t, r in read.items()) - head_s * 2.0
    assert pred.prefill_s(4) == pytest.approx(
        body + head_s + cal.t0_s + 32 * cal.layer_s + 128256 * cal.vocab_s, rel=1e-9
    )
    assert pred.prefill_s(64) > pred.prefill_s(16)  # past the table: the batched rate's compute


def test_measure_steps_times_several_tokens_per_decode(tiny_model):
    from dataclasses import replace as with_

    from ondevice.probing import kernel
    from tests.probe_fakes import TINY

    plan = with_(TINY, n_prefill=32, step_tokens=(2, 4), step_reps=1)
    ratios = kernel.measure_steps(tiny_model, plan, n_threads=1, n_gpu_layers=0)
    assert set(ratios) == {2, 4} and all(r > 0 for r in ratios.values())


def test_a_kernel_is_sped_up_by_the_caches_no_faster_than_it_ran_from_them():
    """The read curve gives 3x at 16 MiB against 10/3 all-cached: a share h = (1 - 1/3) / (1 - 3/10) of the
    bytes comes from the caches. A Q4_0 kernel that reached 1.2x its DRAM rate on cached weights reads that
    share 1.2x faster (1 / (h / 1.2 + 1 - h) in all), an F16 one at the curve's speed; the ceiling keeps the curve's."""
    from ondevice.roofline.spec import spec_from_flags

    q4 = spec_from_flags(params=25e6, quant="Q4_0", layers=2, kv_heads=1, head_dim=64)  # ~14 MB
    f16 = spec_from_flags(params=7e6, quant="F16", layers=2, kv_heads=1, head_dim=64)  # ~14 MB
    cal = _cal(type_gbs={"Q4_0": 40.0, "F16": 40.0}, kv_gbs=40.0, read_curve=CURVE)
    capped = replace(cal, type_cached_gbs={"Q4_0": 48.0, "F16": 40.0 * 100 / 30})  # F16: as fast as the all-cached read
    h = (1 - 1 / 3) / (1 - 3 / 10)
    for spec, want in ((q4, 1 / (h / 1.2 + 1 - h)), (f16, None)):
        plain, kernel = Predictor(spec, cal), Predictor(spec, capped)
        curve = plain.cache_speedup(0)
        assert curve > 2.5 and plain.kernel_speedup(0) == curve  # no cached rates: the read curve alone
        assert kernel.kernel_speedup(0) == pytest.approx(want or curve, rel=0.03)  # (the KV's few bytes at F16's)
        assert kernel.step_s(0)[0] == plain.step_s(0)[0]  # the bound is the read curve's


def test_past_what_the_caches_hold_the_kernels_keep_a_share_that_fades_with_size():
    """The curve's knee (its biggest size read at least halfway from DRAM's speed to the all-cached one:
    16 MiB here) is what the caches hold. Within it the calibrated step reads the curve's cached share h at
    each kernel's cached rate; past it the kernels keep h x knee / step bytes (a plain cyclic read past it
    still gains on the curve: the L3 keeps part of the scan; the decode kernels gain less). Without the
    kernels' cached rates nothing is gained past the knee. The ceiling, a bound, keeps the curve's everywhere."""
    from ondevice.roofline import cache_bytes, read_speedup
    from ondevice.roofline.spec import spec_from_flags

    assert cache_bytes(CURVE) == 16 << 20 and cache_bytes(()) == 0
    cached = {"Q4_0": 80.0, "F16": 100.0}  # 2x and 1.25x their DRAM rates below
    cal = _cal(type_gbs={"Q4_0": 40.0, "F16": 80.0}, kv_gbs=80.0, read_curve=CURVE)
    small = spec_from_flags(params=20e6, quant="Q4_0", layers=4, kv_heads=2, head_dim=64)  # ~11 MB
    mid = spec_from_flags(params=60e6, quant="Q4_0", layers=4, kv_heads=2, head_dim=64)  # ~34 MB: the curve gains there
    for spec, past in ((small, False), (mid, True)):
        pred, plain = Predictor(spec, replace(cal, type_cached_gbs=cached)), Predictor(spec, _cal())
        step_bytes = pred.step_bytes(64)
        memory = read_speedup(CURVE, step_bytes)
        assert memory > 1.5 and (step_bytes > 16 << 20) is past
        h = (1 - 1 / memory) / (1 - 30 / 100) * ((16 << 20) / step_bytes if past else 1.0)
        assert pred.kernel_speedup(64) == pytest.approx(1 / (h / 2.0 + 1 - h), rel=0.02)  # Q4_0's bytes, nearly all
        assert pred.step_s(64)[0] < plain.step_s(64)[0]  # the bound keeps the curve's speed-up
        no_caps = Predictor(spec, cal)
        assert no_caps.kernel_speedup(64) == (1.0 if past else memory)
    # the share fades: the further past the knee, the less of the within-knee speed-up is left
    big = spec_from_flags(params=200e6, quant="Q4_0", layers=4, kv_heads=2, head_dim=64)  # ~110 MB
    mid_pred, big_pred = (Predictor(s, replace(cal, type_cached_gbs=cached)) for s in (mid, big))
    assert 1.0 < big_pred.kernel_speedup(64) < mid_pred.kernel_speedup(64)


def test_a_gpu_calibration_leaves_the_hosts_caches_out():
    """The host's read curve says what the CPU's caches do; a GPU backend's calibration goes without it."""
    from dataclasses import replace as with_

    from tests.probe_fakes import fake_result, nvidia_host

    curve = ((2 << 20, 100.0), (256 << 20, 30.0))
    cpu = with_(fake_result(build="b"), read_curve=curve).calibration()
    gpu = with_(fake_result(build="b", backend="CUDA", host=nvidia_host()), read_curve=curve).calibration()
    assert cpu.read_curve == curve
    assert gpu.read_curve == ()


def test_the_caches_speed_up_a_chunks_read_not_its_arithmetic():
    """A cache-resident model's prefill chunk reads its weights faster, once; the products over its
    other tokens take what they take from DRAM too: 256 tokens gain what 1 token gains."""
    from ondevice.roofline.spec import spec_from_flags

    small = spec_from_flags(params=20e6, quant="Q4_0", layers=4, kv_heads=2, head_dim=64)  # ~11 MB
    plain, cached = Predictor(small, _cal()), Predictor(small, _cal(read_curve=CURVE))
    gain = [plain.prefill_s(n) - cached.prefill_s(n) for n in (1, 256)]
    assert gain[0] > 0 and gain[1] == pytest.approx(gain[0], rel=1e-9)
    steps = [plain.tokens_step_s(64, n) - cached.tokens_step_s(64, n) for n in (1, 8)]
    assert steps[1] == pytest.approx(steps[0], rel=1e-9)


def test_the_cpu_ttft_floor_uses_the_fastest_matrix_product_measured():
    """numpy's f32 matmul is no bound for llama.cpp's integer kernels: on the CPU the floor takes the
    kernel probe's fastest batched rate when it is higher; with no kernel probe, the host's f32."""
    from ondevice.roofline.target import ttft_compute
    from tests.probe_fakes import fake_result

    probe = fake_result(build="b")
    fast = replace(probe, kernel=replace(probe.kernel, type_gflops={"Q4_0": 90.0, "Q6_K": 400.0}))
    assert ttft_compute("CPU", 100.0, fast)[0] == 400.0 and "Q6_K" in ttft_compute("CPU", 100.0, fast)[1]
    slow = replace(probe, kernel=replace(probe.kernel, type_gflops={"Q4_0": 90.0}))
    assert ttft_compute("CPU", 100.0, slow) == (100.0, None)
    assert ttft_compute("CPU", 100.0, None) == (100.0, None)
