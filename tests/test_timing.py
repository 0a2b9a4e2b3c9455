"""The prediction from a model's timed shape (roofline.timing): exact on a model whose speed follows the
arithmetic it assumes, layer extrapolation exact for identical blocks, stored timings validated."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ondevice.gguf.spec import inspect
from ondevice.roofline import Calibration, ShapeTiming, TimedPredictor, extrapolate_layers
from ondevice.roofline.attention import decode_kv_padding, decode_spans
from ondevice.roofline.timing import robust_line
from tests.probe_fakes import (
    TRUTH,
    fake_timing,
    true_batch_s,
    true_chunk_s,
    true_decode_s,
    true_matmul_s,
)

CAL = Calibration("CPU", ceiling_gbs=40.0)


@pytest.fixture(scope="module")
def gemma(default_model):
    return inspect(default_model)  # sliding-window layers: the arithmetic must count their window


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return inspect(tiny_model)


@pytest.mark.parametrize("which", ["tiny", "gemma"])
def test_decode_is_exact_at_every_context(which, request):
    spec = request.getfixturevalue(which)
    pred = TimedPredictor(spec, CAL, fake_timing(spec))
    for n in (0, 1, 100, 511, 512, 513, 2000, 8000):
        assert pred.step_s(n)[1] == pytest.approx(true_decode_s(spec, n), rel=1e-9)
        assert pred.step_s(n)[0] == pytest.approx(spec.kv_read_bytes(n) / 40e9 + spec.decode_weight_bytes / 40e9)


@pytest.mark.parametrize("which", ["tiny", "gemma"])
def test_ttft_is_exact_for_any_prompt_and_cached_prefix(which, request):
    spec = request.getfixturevalue(which)
    pred = TimedPredictor(spec, CAL, fake_timing(spec))
    for n_prompt, cached in ((1, 0), (7, 0), (100, 0), (300, 0), (512, 0), (1024, 0), (1500, 0), (4096, 0), (900, 600)):
        expected, pos, left = 0.0, cached, n_prompt - cached
        while left:
            k = min(512, left)
            expected += true_chunk_s(spec, pos, k)
            pos, left = pos + k, left - k
        assert pred.ttft_s(n_prompt, cached, n_batch=2048) == pytest.approx(expected, rel=1e-9), (n_prompt, cached)


def test_chunks_follow_the_timed_micro_batch(tiny):
    pred = TimedPredictor(tiny, CAL, fake_timing(tiny, n_ubatch=256))
    two = true_chunk_s(tiny, 0, 256) + true_chunk_s(tiny, 256, 256)
    assert pred.prefill_s(512, 0, n_batch=2048) == pytest.approx(two, rel=1e-9)
    assert pred.prefill_s(512, 0, n_batch=128) == pytest.approx(
        sum(true_chunk_s(tiny, p, 128) for p in (0, 128, 256, 384)), rel=1e-9
    )


def test_a_chunk_longer_than_any_timed_grows_at_the_last_rate(tiny):
    pred = TimedPredictor(tiny, CAL, fake_timing(tiny, n_ubatch=2048))
    assert pred.chunk_s(0, 1024) == pytest.approx(true_chunk_s(tiny, 0, 1024), rel=1e-9)


def test_batch_steps_are_the_timed_ones_and_move_with_the_context(gemma):
    pred = TimedPredictor(gemma, CAL, fake_timing(gemma))
    for b in (2, 4, 8, 16):
        assert pred.tokens_step_s(20, 1, b) == pytest.approx(true_batch_s(b), rel=1e-9)
    assert pred.tokens_step_s(20, 1, 6) == pytest.approx(true_batch_s(6), rel=1e-9)  # linear between 4 and 8
    assert pred.tokens_step_s(20, 1, 1) == pred.step_s(20)[1]
    extra = TRUTH["b"] * 4 * (decode_spans(gemma, 1000) - decode_spans(gemma, 20))
    assert pred.tokens_step_s(1000, 1, 4) == pytest.approx(true_batch_s(4) + extra, rel=1e-9)
    assert pred.tokens_step_s(20, 4, 1) > pred.tokens_step_s(20, 1, 1)  # a verify of 4 tokens


def test_without_batch_steps_several_tokens_cost_a_chunk_and_the_head(gemma):
    pred = TimedPredictor(gemma, CAL, fake_timing(gemma, batch=(), batch_ctx=0))
    head_share = gemma.head_bytes / gemma.decode_weight_bytes
    attention = TRUTH["b"] * sum(decode_spans(gemma, 100 + i) for i in range(4))  # four tokens from position 100
    expected = true_matmul_s(4) + attention + 3 * head_share * true_decode_s(gemma, 0)
    assert pred.tokens_step_s(100, 4, 1) == pytest.approx(expected, rel=1e-9)


def test_e2e_is_ttft_plus_the_growing_steps(tiny):
    pred = TimedPredictor(tiny, CAL, fake_timing(tiny))
    steps = sum(true_decode_s(tiny, 100 + i) for i in range(1, 32))
    assert pred.e2e_s(100, 32) == pytest.approx(pred.ttft_s(100) + steps, rel=1e-9)
    assert pred.basis == "measured"


def test_the_attention_cost_of_prefill_comes_from_the_chain_of_chunks(gemma):
    # a model whose chunks cost more per attention cell: only the chain timed after cached tokens says so
    slow = dict(TRUTH, c=9e-8)
    pred = TimedPredictor(gemma, CAL, fake_timing(gemma, slow))
    # at the chain's positions, between and past them by attention cells, and inside the first window (which fills
    # up there: its layers' cells grow more slowly than the position)
    for pos in (256, 512, 1024, 1536, 3000, 8000):
        assert pred.chunk_s(pos, 512) == pytest.approx(true_chunk_s(gemma, pos, 512, slow), rel=1e-9)
    assert pred.chunk_s(1200, 100) == pytest.approx(true_chunk_s(gemma, 1200, 100, slow), rel=1e-9)


def test_a_long_prompt_takes_the_attention_cost_of_every_link_not_the_slope_of_the_last_two(tiny):
    """A large model's twins time a chain of two links; the fewer twin's figures are multiplied by the model's
    blocks. One link off by a noisy moment (here the first, 50% of what its attention adds) moves a prompt of 4,096
    tokens by a share of that, not by the slope between the two links stretched over six more chunks (Gemma 2 2B:
    predicted 17% fast at 4,096 tokens in r10)."""
    costly = dict(TRUTH, c=2e-7)  # attention a third of the prompt's time, as Gemma 2 2B's at 4,096 tokens
    timing = fake_timing(tiny, costly)
    noisy = tuple(
        (pos, k, t + (0.5 * (t - true_matmul_s(512)) if pos == 512 else 0.0))
        for pos, k, t in timing.prefill
        if pos <= 1024
    )
    pred = TimedPredictor(tiny, CAL, replace(timing, prefill=noisy))
    truth = sum(true_chunk_s(tiny, pos, 512, costly) for pos in range(0, 4096, 512))
    assert 0.6 * truth < sum(true_matmul_s(512) for _ in range(8)) < 0.7 * truth
    assert pred.prefill_s(4096) == pytest.approx(truth, rel=0.05)
    assert pred.prefill_s(4096) > truth  # the slow link still counts: the error is on the safe side


def _twins(spec, layers: int):
    """A model of `layers` identical blocks: every figure t0 + layers x t1."""
    per = dict(a=0.002, b=1e-9, m0=0.001, m1=1e-4, c=2e-9, w0=0.001, w1=2e-4)
    fixed = dict(a=0.004, b=0.0, m0=0.003, m1=1e-5, c=0.0, w0=0.002, w1=1e-5)
    return fake_timing(spec, {k: fixed[k] + layers * per[k] for k in per})


def _stair_cells(n_ctx: int) -> int:
    """The KV cells a decode step at n_ctx costs on the CPU with flash attention over an f16 cache (measured on
    Qwen3 0.6B, benchmarks/data/twin_speed/epyc-zen4-2vcpu-kv-view-stairs.txt): llama.cpp's view of the cells in
    use, this token's included, rounded up to 256; below a view of 512, the cells in use."""
    view = (n_ctx + 1 + 255) // 256 * 256
    return view if view >= 512 else n_ctx


def test_the_decode_steps_stairs_of_the_padded_kv_view_are_predicted_where_the_count_of_tokens_leans_slow(tiny):
    """A decode step costs the padded KV view (a step function in stairs of 256 cells from 512 on): the timing's
    points (short contexts, then 2-16 steps past multiples of 512, the stairs' worst) read as the cached tokens make
    the step's cost per token too steep, and a long prompt's decode too slow; read as the view, they are exact."""

    def truth(n_ctx: int) -> float:
        return 0.010 + 2e-6 * tiny.n_layer * _stair_cells(n_ctx)  # attention most of a long step, as on a CPU

    points = tuple((c, truth(c)) for c in (3, 6, 18, 24, 66, 130, 514, 1026, 1538, 2056))
    timing = replace(fake_timing(tiny), decode=points, kv_pad=256, kv_pad_from=512)
    pred = TimedPredictor(tiny, CAL, timing)
    for n in (0, 24, 128, 255, 256, 300, 511, 512, 1040, 2000, 4112, 8000):
        assert pred.step_s(n)[1] == pytest.approx(truth(n), rel=1e-9), n
    counted = TimedPredictor(tiny, CAL, replace(timing, kv_pad=1, kv_pad_from=0))  # the cached tokens alone
    assert counted.step_s(4112)[1] > 1.03 * truth(4112)


def test_which_engines_decode_costs_the_padded_view():
    assert decode_kv_padding("CPU", True, "f16", "f16") == (256, 512)
    assert decode_kv_padding("CPU", None, "F32", "f32") == (256, 512)  # flash attention "auto": llama.cpp did not say
    assert decode_kv_padding("CPU", True, "q8_0", "q8_0") == (1, 0)  # whole heads per thread, masked cells skipped
    assert decode_kv_padding("CPU", True, "f16", "q8_0") == (1, 0)
    assert decode_kv_padding("CPU", False, "f16", "f16") == (1, 0)
    assert decode_kv_padding("CUDA", True, "f16", "f16") == (1, 0)


def test_the_padded_view_counts_stairs_and_keeps_windows(tiny, gemma):
    per_layer = {n: decode_spans(tiny, n, 256, 512) / tiny.n_layer for n in (24, 255, 256, 300, 511, 767, 768, 4096)}
    assert per_layer == {24: 24, 255: 255, 256: 512, 300: 512, 511: 512, 767: 768, 768: 1024, 4096: 4352}
    assert decode_spans(tiny, 4096, 1, 0) == decode_spans(tiny, 4096) == 4096 * tiny.n_layer
    window = gemma.sliding_window
    windowed = sum(1 for i in gemma.swa_layers)
    full = gemma.n_layer - windowed
    assert decode_spans(gemma, 4096, 256, 512) == windowed * window + full * 4352


def test_layer_extrapolation_is_exact_for_identical_blocks(tiny):
    full = extrapolate_layers(_twins(tiny, 1), _twins(tiny, 3), 1, 3, 32)
    truth = _twins(tiny, 32)
    for got, want in zip(full.decode + full.prefill + full.batch, truth.decode + truth.prefill + truth.batch):
        assert got[:-1] == want[:-1] and got[-1] == pytest.approx(want[-1], rel=1e-9)
    assert full.source == "twins" and full.layers == (1, 3)


def test_attention_points_timed_on_the_fewer_twin_alone_scale_with_the_blocks(gemma):
    """The larger twin skips the chain and the long-context decode (the costly part of a large model's timing):
    attention is the same in every block, so the fewer twin's figures there scale to the model's blocks."""
    many = _twins(gemma, 18)
    many = replace(many, prefill=tuple(p for p in many.prefill if p[0] == 0), decode=many.decode[:1])
    full = extrapolate_layers(_twins(gemma, 6), many, 6, 18, 36)
    truth = _twins(gemma, 36)
    assert [p[:-1] for p in full.prefill] == [p[:-1] for p in truth.prefill]
    for got, want in zip(full.decode + full.prefill, truth.decode + truth.prefill):
        assert got[-1] == pytest.approx(want[-1], rel=1e-9), got


def test_the_fewer_twins_attention_is_a_robust_line_before_it_is_multiplied(gemma):
    """Points timed on the fewer twin alone are multiplied by the model's blocks over the twin's: with the twin's
    attention cells given, they come from its attention per cell (the short points' median to the longest, the
    pair its timing measures in the same moments), so one point timed on a busy moment does not move the
    model's figure there by the multiple of its noise."""
    few, many = _twins(gemma, 6), _twins(gemma, 18)
    contexts = (24, 514, 1026, 1538, 2056)

    def decode(layers: int, ctx: int) -> float:
        return 0.004 + layers * 0.002 + layers * 1e-9 * decode_spans(gemma, ctx)

    few = replace(few, decode=tuple((c, decode(6, c) * (1.5 if c == 1026 else 1.0)) for c in contexts))
    many = replace(many, decode=((24, decode(18, 24)),), prefill=tuple(p for p in many.prefill if p[0] == 0))
    full = extrapolate_layers(few, many, 6, 18, 36, lambda ctx: decode_spans(gemma, ctx))
    for ctx, t in full.decode:
        assert t == pytest.approx(decode(36, ctx), rel=1e-9), ctx  # the busy point included
    naive = dict(extrapolate_layers(few, many, 6, 18, 36).decode)
    assert naive[1026] > 1.5 * decode(36, 1026)  # point by point, its noise was multiplied
    # so the fewer twin's points between those two are not timed (time_pair): the model's decode line is the same
    ends = replace(few, decode=(few.decode[0], few.decode[-1]))
    alone = extrapolate_layers(ends, many, 6, 18, 36, lambda ctx: decode_spans(gemma, ctx))
    lines = [robust_line([(t.decode_cells(gemma, c), s) for c, s in t.decode]) for t in (full, alone)]
    assert lines[1] == pytest.approx(lines[0], rel=1e-9)


def test_layer_extrapolation_refuses_twins_timed_on_other_points(tiny):
    other = replace(_twins(tiny, 3), decode=((20, 0.01), (600, 0.02), (700, 0.03)))
    with pytest.raises(ValueError, match="different decode points"):
        extrapolate_layers(_twins(tiny, 1), other, 1, 3, 32)
    with pytest.raises(ValueError, match="two different block counts"):
        extrapolate_layers(_twins(tiny, 1), _twins(tiny, 3), 3, 3, 32)


def test_a_timing_round_trips_through_json(gemma):
    t = fake_timing(gemma, spread=0.03, other_cpu_cores=0.4, elapsed_s=2.5, created_unix_s=1.7e9, plan="quick")
    assert ShapeTiming.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    "damage",
    [
        {"decode": [[20, float("nan")]]},
        {"decode": [[20, -1.0]]},
        {"decode": [[20, float("inf")]]},
        {"decode": []},
        {"prefill": [[5, 64, 0.1]]},  # nothing from an empty cache
        {"prefill": [[0, -3, 0.1]]},
        {"batch": [[2, 0.0]]},
        {"decode": [[n, 0.01] for n in range(100)]},
        {"spread": float("nan")},
        {"other_cpu_cores": -1},
    ],
)
def test_a_damaged_timing_is_refused(gemma, damage):
    d = {**fake_timing(gemma).to_dict(), **damage}
    with pytest.raises((ValueError, TypeError)):
        ShapeTiming.from_dict(d)


def test_noise_is_said_in_the_prediction(gemma):
    from ondevice.roofline.prediction import timing_notes

    assert timing_notes(fake_timing(gemma)) == []
    busy = timing_notes(fake_timing(gemma, other_cpu_cores=0.9, spread=0.2))
    assert len(busy) == 1 and "other processes used 0.9 cores" in busy[0] and "20% apart" in busy[0]
    assert "may be slow" in busy[0]
    # rounds apart on an otherwise idle machine: said, not blamed on other processes
    moved = timing_notes(fake_timing(gemma, other_cpu_cores=0.0, spread=0.11))
    assert len(moved) == 1 and "11% apart" in moved[0] and "may be slow" not in moved[0] and "0.0 cores" in moved[0]
    twins = timing_notes(replace(fake_timing(gemma), source="twins", layers=(1, 3)))
    assert twins == ["timed on twins of 1 and 3 layers, extrapolated in layers"]


def test_decode_line_never_slopes_down(tiny):
    # a noisy pair of decode points, the longer context faster: no attention cost rather than a negative one
    t = replace(fake_timing(tiny), decode=((20, 0.013), (580, 0.012)))
    pred = TimedPredictor(tiny, CAL, t)
    assert pred.step_s(5000)[1] == pytest.approx(0.0125) and not math.isnan(pred.step_s(0)[1])
