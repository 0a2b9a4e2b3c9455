"""Predicted TTFT, E2E and multi-token steps: the source articles' worked timelines, the
prefill arithmetic by hand, and the measured attribution of a real request adding up."""

from __future__ import annotations

import pytest

from ondevice.core.results import Timings
from ondevice.roofline import Calibration, Predictor, causal_spans, chunk_flops, effective_gbs
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
        compute_gflops=200.0,
        source="estimate",
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
    two = pred.tokens_step_s(1000, 2) - pred.tokens_step_s(1000, 1)
    extra_flops = chunk_flops(spec, 1000, 2, 2) - chunk_flops(spec, 1000, 1, 1)  # the second token, logits included
    assert two == pytest.approx(extra_flops / (200.0 * GB), rel=1e-9)
    # a batch of B sequences reads every sequence's KV: B - 1 more reads than one sequence
    b4 = pred.tokens_step_s(1000, 1, 4) - pred.tokens_step_s(1000, 1, 1)
    assert b4 == pytest.approx(
        3 * chunk_flops(spec, 1000, 1, 1) / (200 * GB) + 3 * pred.kv_read_bytes(1000) / (80 * GB)
    )
    assert pred.ceiling_tokens_step_s(1000, 1, 4) == pytest.approx(
        (spec.decode_weight_bytes + 4 * pred.kv_read_bytes(1000)) / (100 * GB)
    )
    fast = Predictor(spec, _cal(compute_gflops=200000.0))  # a GPU's compute
    assert fast.tokens_step_s(1000, 8) < 1.2 * fast.tokens_step_s(1000, 1)  # the weights are read once


def test_prefill_by_hand_in_chunks():
    """Each chunk: the larger of one read of the weights (with the KV so far) and its FLOPs."""
    spec = _spec()
    pred = Predictor(spec, _cal())
    weights_s = sum(b / (effective_gbs(t, _cal()) * GB) for t, b in spec.decode_bytes_by_type.items())
    read = [weights_s + spec.kv_read_bytes(pos) / (80 * GB) + 1e-4 for pos in (0, 512)]
    compute = [chunk_flops(spec, 0, 512, 0) / (200 * GB), chunk_flops(spec, 512, 512, 1) / (200 * GB)]
    expected = max(read[0], compute[0]) + max(read[1], compute[1])
    assert pred.prefill_s(1024, n_batch=512) == pytest.approx(expected, rel=1e-9)
    assert pred.prefill_s(0) == 0.0
    slow_read = Predictor(spec, _cal(compute_gflops=1e9))  # compute free: each chunk is one read
    assert slow_read.prefill_s(1024, n_batch=512) == pytest.approx(sum(read), rel=1e-9)


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


# ---- a real request: predicted TTFT/E2E beside measured, the attribution adds up ----


def test_generation_carries_predictions_and_an_attribution(tiny_model):
    from ondevice.engine import load
    from ondevice.gguf.spec import inspect

    spec = inspect(tiny_model)
    pred = Predictor(spec, _cal(type_gbs={"F16": 10.0}, compute_gflops=20.0))
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


def test_a_gpu_calibration_leaves_the_hosts_caches_out():
    """The host's read curve says what the CPU's caches do; a GPU backend's calibration goes without it."""
    from dataclasses import replace as with_

    from tests.probe_fakes import fake_result, nvidia_host

    curve = ((2 << 20, 100.0), (256 << 20, 30.0))
    cpu = with_(fake_result(build="b"), read_curve=curve).calibration()
    gpu = with_(fake_result(build="b", backend="CUDA", host=nvidia_host()), read_curve=curve).calibration()
    assert cpu.read_curve == curve
    assert gpu.read_curve == ()
