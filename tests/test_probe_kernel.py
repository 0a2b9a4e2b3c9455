"""Kernel probe: the fit recovers known parameters exactly; models are built once; one real decode, bounded."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ondevice.core.errors import ProbeError
from ondevice.gguf.spec import inspect
from ondevice.probing import kernel
from ondevice.probing.kernel import FitPoint, fit_points, plan_for, probe_kernels
from ondevice.roofline import score_s
from tests.probe_fakes import TINY, TRUE, fake_measure, fake_measure_pair, fake_measure_steps, model_time


def points(p=TRUE) -> list[FitPoint]:
    spec = [
        ("sized", "Q4_0", 150e6, 5, 512, 0, 0),
        ("sized", "Q8_0", 280e6, 5, 512, 0, 0),
        ("sized", "F16", 520e6, 5, 512, 0, 0),
        ("tiny", "Q4_0", 1e5, 2, 512, 0, 0),
        ("tiny", "Q8_0", 2e5, 2, 512, 0, 0),
        ("tiny", "F16", 3e5, 2, 512, 0, 0),
        ("tiny", "F16", 2e6, 16, 512, 0, 0),
        ("tiny", "F16", 4e6, 2, 32000, 0, 0),
        ("attn", "F16", 1e7, 4, 512, 2200, 128),
        ("attn", "F16", 1.4e7, 4, 512, 132000, 128),
        ("attn", "F16", 1e7, 4, 512, 1100, 256),
        ("attn", "F16", 1.4e7, 4, 512, 66000, 256),
        ("attn", "F16", 1e7, 4, 512, 550, 512),
        ("attn", "F16", 1.4e7, 4, 512, 33000, 512),
        ("narrow", "Q8_0", 150e6, 30, 512, 0, 0),
    ]
    rows = {"sized": 110_000, "narrow": 190_000, "tiny": 1_500, "attn": 40_000}  # matrix rows per step
    return [
        FitPoint(
            r,
            t,
            int(b),
            n,
            v,
            m,
            h,
            model_time(t, int(b), n, v, m, h, p, rows[r] + (v if r == "tiny" else 0)),
            rows[r] + (v if r == "tiny" else 0),
        )
        for r, t, b, n, v, m, h in spec
    ]


def test_fit_recovers_known_parameters_exactly():
    fit = fit_points(points(), TINY.types)
    for t, gbs in TRUE["type_gbs"].items():
        assert fit["type_gbs"][t] == pytest.approx(gbs, rel=1e-9)
    for k in ("t0_s", "layer_s", "vocab_s", "row_s"):
        assert fit[k] == pytest.approx(TRUE[k], rel=1e-6)
    truth = dict(TRUE["attn_score_s"])
    assert [d for d, _ in fit["attn_score_s"]] == [128, 256, 512]  # one entry per attention model's head
    for dims, sec in fit["attn_score_s"]:  # not a line in the head's length: 12, 35, 15 ns, each recovered
        assert sec == pytest.approx(truth[dims], rel=1e-6)
    assert fit["rms_rel_error"] < 1e-9


def test_without_a_narrow_model_the_row_cost_stays_in_the_bandwidths():
    """No narrow run: row_s is pinned at 0 and each sized run's rows are read as slower bytes."""
    pts = [q for q in points() if q.role != "narrow"]
    fit = fit_points(pts, TINY.types)
    assert fit["row_s"] == 0.0
    q8 = next(q for q in pts if q.role == "sized" and q.weight_type == "Q8_0")
    assert fit["type_gbs"]["Q8_0"] < TRUE["type_gbs"]["Q8_0"]
    assert fit["type_gbs"]["Q8_0"] == pytest.approx(
        q8.step_bytes / (q8.step_s - TRUE["t0_s"] - 5 * TRUE["layer_s"] - 512 * TRUE["vocab_s"]) / 1e9, rel=0.02
    )


def test_one_attention_model_prices_every_head_alike():
    """With one head size the table has one entry: every head's score costs what that model's did."""
    pts = [q for q in points() if q.head_dims == 128 or q.role != "attn"]
    fit = fit_points(pts, TINY.types)
    assert fit["attn_score_s"] == ((128, pytest.approx(dict(TRUE["attn_score_s"])[128], rel=1e-6)),)
    assert score_s(fit["attn_score_s"], 512) == score_s(fit["attn_score_s"], 64) == fit["attn_score_s"][0][1]


def test_score_s_interpolates_between_the_measured_heads_and_clamps_past_them():
    table = ((128, 1.2e-8), (256, 3.5e-8), (512, 1.5e-8))
    assert score_s(table, 192) == pytest.approx(2.35e-8)
    assert score_s(table, 384) == pytest.approx(2.5e-8)
    assert score_s(table, 64) == 1.2e-8 and score_s(table, 1024) == 1.5e-8 and score_s((), 128) == 0.0


def test_fit_keeps_small_terms_non_negative():
    p = {**TRUE, "layer_s": 0.0, "vocab_s": 0.0}
    pts = points(p)
    pts[6] = replace(pts[6], step_s=pts[6].step_s * 0.7)  # more layers, faster: noise
    for long in (9, 11, 13):  # a long context no faster: noise
        pts[long] = replace(pts[long], step_s=pts[long - 1].step_s * 0.9)
    fit = fit_points(pts, TINY.types)
    assert min(fit["layer_s"], fit["vocab_s"], fit["t0_s"], *(sec for _d, sec in fit["attn_score_s"])) >= 0
    assert fit["rms_rel_error"] > 0


def test_sized_runs_alone_set_the_bandwidths():
    """Tiny models read from cache: however fast they run, the F16 bandwidth comes from the sized run."""
    pts = points()
    fast_tiny = [replace(q, step_s=q.step_s * 0.5) if q.role == "tiny" else q for q in pts]
    assert fit_points(fast_tiny, TINY.types)["type_gbs"]["F16"] == pytest.approx(TRUE["type_gbs"]["F16"], rel=0.02)


def test_fit_errors():
    with pytest.raises(ProbeError, match="no measurement for \\['Q8_0'\\]"):
        fit_points([p for p in points() if not (p.weight_type == "Q8_0" and p.role == "sized")], TINY.types)
    with pytest.raises(ProbeError, match="not positive"):
        fit_points([FitPoint("tiny", "F16", 1, 1, 1, 0, 0, 0.0)] + points(), TINY.types)


def test_fixed_costs_above_the_sized_runs_are_dropped():
    """Tiny runs slower than the big ones (a busy moment): the fixed costs go to zero, the error shows it."""
    slow_tiny = [replace(q, step_s=1.0) if q.role == "tiny" else q for q in points()]
    fit = fit_points(slow_tiny, TINY.types)
    assert fit["t0_s"] == fit["layer_s"] == fit["vocab_s"] == 0.0
    assert all(g > 0 for g in fit["type_gbs"].values()) and fit["rms_rel_error"] > 0.3


def test_fit_of_nonsense_says_so():
    """Noisy runs (a busy machine): a fit comes back, with a large error."""
    noisy = [replace(q, step_s=q.step_s * (3.0 if i % 2 else 0.5)) for i, q in enumerate(points())]
    assert fit_points(noisy, TINY.types)["rms_rel_error"] > 0.3


def test_plan_sizes_dwarf_the_cache():
    plan = plan_for(32 << 20)
    f16 = plan.n_layer * plan.layer_bytes_f16()
    assert f16 * 4.5 / 16 >= 4 * (32 << 20)  # the Q4_0 model is at least 4x the last-level cache
    assert plan_for(None).n_layer * plan.layer_bytes_f16() >= 256 << 20
    assert plan_for(256 << 20).n_layer > plan.n_layer


def test_probe_kernels_pipeline_with_known_step_times(tmp_path, monkeypatch):
    """Real models built (tiny), measurement replaced by the model above: the fit comes back exactly."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(kernel, "measure", fake_measure(calls))
    monkeypatch.setattr(kernel, "measure_steps", fake_measure_steps)
    monkeypatch.setattr(kernel, "measure_pair", fake_measure_pair)
    said: list[str] = []
    k = probe_kernels(TINY, tmp_path / "models", progress=said.append)
    n = 16 + 2 * len(
        TINY.attn_shapes
    )  # sized x3, narrow, cached x3, tiny x5, prefill x3 + narrow, each attention model
    n_long = len(TINY.attn_shapes)  # the attention models' long prompts are prefill points too
    assert len(calls) == n * TINY.passes and len(k.points) == n + n_long
    assert all(calls[n * i : n * (i + 1)] == calls[:n] for i in range(TINY.passes))  # round-robin passes
    assert [c[1] for c in calls[12:16]] == [TINY.n_prefill] * 4 and calls[3][0] == calls[15][0]
    assert calls[3][0].startswith("narrow-") and all(c[0].startswith("cached-") for c in calls[4:7])
    assert calls[-1][1] == TINY.n_long and calls[-2][0] == calls[-1][0]  # an attention model, short then long
    assert calls[-3][1] == TINY.n_long and calls[-3][0] != calls[-1][0]  # ... and the other one
    assert any(s.startswith("building") for s in said) and any(s.startswith("quantizing") for s in said)
    for t, gbs in TRUE["type_gbs"].items():
        assert k.type_gbs[t] == pytest.approx(gbs, rel=1e-6)
    assert k.t0_s == pytest.approx(TRUE["t0_s"], rel=1e-6) and k.backend == "CPU" and k.n_threads == 3
    truth = dict(TRUE["attn_score_s"])
    assert [d for d, _ in k.attn_score_s] == [64, 128, 256]  # TINY's attention models: heads of 32, 64, 128
    assert all(sec == pytest.approx(truth[d], rel=1e-6) for d, sec in k.attn_score_s)
    assert k.pass_spread == 0.0
    for t, gflops in TRUE["type_gflops"].items():  # the prefill rates come back too
        assert k.type_gflops[t] == pytest.approx(gflops, rel=1e-6)
    assert k.attn_gflops == pytest.approx(TRUE["attn_gflops"], rel=1e-6)
    assert k.batch_row_s == pytest.approx(TRUE["batch_row_s"], rel=1e-6) and k.row_s == pytest.approx(
        TRUE["row_s"], rel=1e-6
    )
    assert k.batch_row_width == TINY.row_width()  # the sized rows that batch_row_s is counted against
    assert k.type_cached_gbs == pytest.approx(TRUE["type_cached_gbs"], rel=1e-6)  # each kernel from the caches
    assert k.step_ratios == TRUE["step_ratios"]  # the multi-token step ratios, per type
    said.clear()
    probe_kernels(TINY, tmp_path / "models", progress=said.append)  # second time: models come from the cache
    assert not any(s.startswith(("building", "quantizing")) for s in said)


def test_measure_decodes_through_the_engine(tmp_path):
    """One real decode of a tiny probe model (bounded: a few tokens), no timing asserted."""
    models = kernel.probe_models(TINY, tmp_path, lambda _m: None)
    run = models[0]
    assert run.weight_type == "Q4_0" and "Q4_0" in inspect(run.path).decode_bytes_by_type
    step_s, backend, threads, spec, prefill_s = kernel.measure(run.path, TINY, n_prompt=8, n_threads=1, n_gpu_layers=0)
    assert step_s > 0 and prefill_s > 0 and backend == "CPU" and threads == 1 and spec.n_layer == TINY.n_layer
    step_s, *_, prefill_s = kernel.measure(run.path, TINY, n_prompt=8, n_threads=1, n_gpu_layers=0, decode=False)
    assert step_s == 0.0 and prefill_s > 0


def test_an_attention_models_two_contexts_are_measured_together(tmp_path, monkeypatch):
    """The two runs of each attention model form a pair, decoded in alternating bursts through two real
    engines (bounded by the budget like a single run); measure_run gives both runs' figures at the first."""
    import ondevice.engine as engine_pkg

    runs = kernel.probe_models(TINY, tmp_path, lambda _m: None)
    pairs = kernel.attention_pairs(runs)
    assert len(pairs) == len(TINY.attn_shapes)
    assert all(
        runs[i].path == runs[j].path and (runs[i].n_prompt, runs[j].n_prompt) == (TINY.n_prompt, TINY.n_long)
        for i, j in pairs.items()
    )
    first, second = next(iter(pairs.items()))
    streams = []
    real_load = engine_pkg.load

    def spy_load(*a, **k):
        eng = real_load(*a, **k)
        real_stream = eng.stream
        eng.stream = lambda *sa, **sk: streams.append(real_stream(*sa, **sk)) or streams[-1]
        return eng

    monkeypatch.setattr(engine_pkg, "load", spy_load)
    measured, backend, threads, spec = kernel.measure_run(runs, first, pairs, TINY, n_threads=1, n_gpu_layers=0)
    assert [m[0] for m in measured] == [first, second] and backend == "CPU" and threads == 1
    assert all(step > 0 and prefill > 0 for _i, step, prefill in measured)
    assert [ts.generation.prompt_tokens for ts in streams] == [TINY.n_prompt, TINY.n_long]
    steps = TINY.n_warmup + 1 + -(-TINY.n_tokens // kernel.PAIR_BURST) * kernel.PAIR_BURST
    assert [ts.generation.timings.output_tokens for ts in streams] == [steps, steps]
    assert kernel.measure_run(runs, second, pairs, TINY, n_threads=1, n_gpu_layers=0)[0] == []  # done with its partner
    streams.clear()
    kernel.measure_pair(
        runs[first].path,
        replace(TINY, n_tokens=64, run_budget_s=0.0),
        (TINY.n_prompt, TINY.n_long),
        n_threads=1,
        n_gpu_layers=0,
    )
    assert [ts.generation.timings.output_tokens for ts in streams] == [TINY.n_warmup + 1 + 2 * kernel.PAIR_BURST] * 2


def test_a_run_stops_at_its_time_budget(tmp_path, monkeypatch):
    """With no time budget a run keeps only warm-up + 5 steps instead of the 1000 asked: bounded on a busy machine."""
    import ondevice.engine as engine_pkg

    streams = []
    real_load = engine_pkg.load

    def spy_load(*a, **k):
        eng = real_load(*a, **k)
        real_stream = eng.stream

        def stream(*sa, **sk):
            ts = real_stream(*sa, **sk)
            streams.append((sk["max_tokens"], ts))
            return ts

        eng.stream = stream
        return eng

    monkeypatch.setattr(engine_pkg, "load", spy_load)
    plan = replace(TINY, n_tokens=1000, run_budget_s=0.0)
    run = kernel.probe_models(TINY, tmp_path, lambda _m: None)[0]
    kernel.measure(run.path, plan, n_prompt=8, n_threads=1, n_gpu_layers=0)
    ((max_tokens, ts),) = streams
    assert max_tokens == plan.n_warmup + 1001
    assert ts.generation.finish_reason == "cancelled"
    assert ts.generation.timings.output_tokens == plan.n_warmup + 6


def test_the_median_pass_counts(tmp_path, monkeypatch):
    """A busy pass (twice as slow) and a lucky one (a third faster) do not move the fit: the middle one is kept."""
    exact = fake_measure()
    n_runs = 16 + 2 * len(TINY.attn_shapes)
    factor = {0: 2.0, 1: 1.0, 2: 2 / 3}  # pass -> step time factor
    n = {"calls": 0}

    def uneven_passes(path, plan, **kw):
        step, *rest = exact(path, plan, **kw)
        k = n["calls"] // n_runs
        n["calls"] += 1
        return (step * factor.get(k, 1.0), *rest)

    monkeypatch.setattr(kernel, "measure", uneven_passes)

    monkeypatch.setattr(kernel, "measure_steps", fake_measure_steps)
    monkeypatch.setattr(kernel, "measure_pair", fake_measure_pair)
    k = probe_kernels(TINY, tmp_path / "models")
    assert TINY.passes == 3 and n["calls"] == n_runs * TINY.passes
    assert k.type_gbs["F16"] == pytest.approx(TRUE["type_gbs"]["F16"], rel=1e-6)
    assert k.attn_score_s[-1][1] == pytest.approx(dict(TRUE["attn_score_s"])[256], rel=1e-6)
    assert k.pass_spread == pytest.approx(2.0 / (2 / 3) - 1)  # slowest / fastest pass - 1
