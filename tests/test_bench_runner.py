"""The runner against a fake engine: order, scenarios, failures, time-outs, Ctrl-C."""

from __future__ import annotations

import pytest

from ondevice.bench.record import build_record
from ondevice.bench.report import result_document
from ondevice.bench.runner import BenchConfig, plan_bench, run_bench
from ondevice.bench.runs import COLD_LOAD, LOAD, NO_KV_CACHE, PREFIX_HIT, RESIDENT, WARM_LOAD
from ondevice.bench.scenarios import suffix_tokens
from ondevice.bench.stats import scenario_results
from ondevice.bench.suites import custom_suite, get_suite
from ondevice.core.errors import BenchError, ModelNotFoundError
from tests.bench_fakes import FakeLoader


def config(models, scenarios=(RESIDENT,), p=(64,), n=(8,), repeats=2, **kw):
    return BenchConfig(
        models=tuple(str(m) for m in models),
        suite=custom_suite(p, n, repeats=repeats, warmup=1),
        scenarios=scenarios,
        cap_to_context=False,
        **kw,
    )


def test_models_interleaved_by_repeat(tiny_model, tiny_model_f32):
    loader = FakeLoader()
    out = run_bench(config([tiny_model, tiny_model_f32], repeats=3), load_fn=loader)
    order = [(r.model, r.repeat) for r in out.runs]
    assert order == [
        ("tiny-f16.gguf", 0),
        ("tiny-f32.gguf", 0),
        ("tiny-f32.gguf", 1),
        ("tiny-f16.gguf", 1),
        ("tiny-f16.gguf", 2),
        ("tiny-f32.gguf", 2),
    ]
    assert all(e.closed for e in loader.engines)
    assert not out.incomplete


def test_resident_runs_never_hit_the_cache_and_prompts_are_new(tiny_model):
    loader = FakeLoader()
    out = run_bench(config([tiny_model], p=(128,), repeats=3), load_fn=loader)
    assert all(r.ok and r.cached_prompt_tokens == 0 and r.prompt_tokens == 128 for r in out.runs)
    assert all(r.output_tokens == 8 for r in out.runs)
    calls = loader.engines[0].calls
    assert len(loader.engines) == 1 and [c.n_prompt for c in calls] == [64, 128, 128, 128]  # one warm-up per load
    assert not any(c.reuse_prefix for c in calls)


def test_prefix_hit_reports_cached_tokens_and_ttft_saved(tiny_model):
    out = run_bench(config([tiny_model], scenarios=(PREFIX_HIT,), p=(128,), repeats=2), load_fn=FakeLoader())
    s = suffix_tokens(128)
    for r in out.runs:
        assert r.ok and r.scenario == PREFIX_HIT and r.prompt_tokens == 128
        assert r.cached_prompt_tokens == 128 - s
        # fake prefill is 1 ms per computed token: the hit saves exactly the prefix's prefill
        assert r.baseline_ttft_s - r.timings.ttft_s == pytest.approx((128 - s) * 0.001)
    res = scenario_results(out)[0]
    assert res.summary("ttft_saved_s").p50 == pytest.approx((128 - s) * 0.001)


def test_no_kv_cache_recomputes_the_context_every_token(tiny_model):
    loader = FakeLoader()
    out = run_bench(
        config([tiny_model], scenarios=(RESIDENT, NO_KV_CACHE), p=(32,), n=(40,), repeats=1), load_fn=loader
    )
    ablation = [r for r in out.runs if r.scenario == NO_KV_CACHE]
    assert len(ablation) == 1 and ablation[0].ok
    n = ablation[0].output_tokens_requested
    assert n == 16  # capped to the suite's ablation length
    assert len(ablation[0].timings.itl_s) == n - 1
    calls = [c for c in loader.engines[0].calls if c.max_tokens == 1]
    assert [c.n_prompt for c in calls] == list(range(32, 32 + n))
    assert not any(c.reuse_prefix for c in calls)
    res = {r.scenario: r for r in scenario_results(out)}
    assert res[NO_KV_CACHE].kv_cache_speedup is not None


def test_load_scenarios(tiny_model):
    loader = FakeLoader()
    out = run_bench(config([tiny_model], scenarios=(COLD_LOAD, WARM_LOAD, RESIDENT), repeats=2), load_fn=loader)
    loads = [r for r in out.runs if r.scenario in (COLD_LOAD, WARM_LOAD)]
    assert [r.scenario for r in loads] == [COLD_LOAD, WARM_LOAD] * 2
    for r in loads:
        assert r.status in ("ok", "skipped")
        if r.ok:
            assert r.load_s == pytest.approx(0.25)
    cold = [r for r in loads if r.scenario == COLD_LOAD and r.ok]
    assert all(r.resident_before_load is None or 0 <= r.resident_before_load <= 1 for r in cold)
    assert len(loader.loads) == 4  # cold + warm per repeat; the warm engine serves the requests


def test_a_model_that_fails_to_load_is_a_failed_result(tiny_model, tiny_model_f32):
    loader = FakeLoader(fail={"f32": "out of memory"})
    out = run_bench(config([tiny_model_f32, tiny_model], scenarios=(WARM_LOAD, RESIDENT), repeats=3), load_fn=loader)
    bad = [r for r in out.runs if r.model == "tiny-f32.gguf"]
    assert len(bad) == 1 and bad[0].status == "failed" and "out of memory" in bad[0].reason
    good = [r for r in out.runs if r.model == "tiny-f16.gguf" and r.scenario == RESIDENT]
    assert len(good) == 3 and all(r.ok for r in good)
    assert sum("f32" in p for p in loader.loads) == 1  # not retried every repeat


def test_a_file_that_is_not_gguf_is_a_failed_model(tmp_path, tiny_model):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    plans = plan_bench(config([junk, tiny_model]))
    assert plans[0].error and not plans[1].error
    out = run_bench(config([junk, tiny_model]), plans, load_fn=FakeLoader())
    assert out.runs[0].scenario == LOAD and out.runs[0].status == "failed"
    assert any(r.ok for r in out.runs)


def test_bad_input_is_refused_before_running(tiny_model, tmp_path):
    with pytest.raises(BenchError, match="exceeds the context"):
        plan_bench(config([tiny_model], p=(500,), n=(64,)))  # tiny model: 512-token context
    with pytest.raises(BenchError, match="unknown scenario"):
        plan_bench(config([tiny_model], scenarios=("hot_load",)))
    with pytest.raises(ModelNotFoundError):
        plan_bench(config([tmp_path / "nope.gguf"]))
    with pytest.raises(BenchError, match="trained context"):
        plan_bench(config([tiny_model], n_ctx=100000))


def test_builtin_suite_is_capped_and_context_chosen(tiny_model):
    cfg = BenchConfig(models=(str(tiny_model),), suite=get_suite("standard"), scenarios=(RESIDENT,))
    plan = plan_bench(cfg)[0]
    assert plan.n_ctx == 512
    assert all(w.prompt_tokens + w.output_tokens <= 512 for w in plan.suite.workloads)
    assert plan.suite.workloads[1].capped_from == 8192
    gen = plan.suite.workloads[2]
    assert (gen.prompt_tokens, gen.output_tokens, gen.output_capped_from) == (256, 256, 1024)


def test_timeout_is_kept_with_its_reason(tiny_model):
    def hang(engine, i, cancel):
        if i == 3 and cancel is not None:
            cancel.wait(5)

    out = run_bench(config([tiny_model], repeats=2, timeout_s=0.05), load_fn=FakeLoader(on_token=hang))
    assert [r.status for r in out.runs] == ["timeout", "timeout"]
    assert "timeout after 0.05 s (3 of 8 tokens)" in out.runs[0].reason
    res = scenario_results(out)[0]
    assert res.ok_runs == 0 and len(res.failures) == 2 and len(res.runs) == 2


def test_ctrl_c_keeps_what_was_gathered(tiny_model):
    seen = {"requests": 0}

    def interrupt(engine, i, cancel):
        if i == 0:
            seen["requests"] += 1
        if seen["requests"] == 4 and i == 2:  # one warm-up, 2 measured, then the 3rd measured request
            raise KeyboardInterrupt

    loader = FakeLoader(on_token=interrupt)
    cfg = config([tiny_model], repeats=5)
    out = run_bench(cfg, load_fn=loader)
    assert out.incomplete
    assert [r.status for r in out.runs] == ["ok", "ok", "interrupted"]
    assert all(e.closed for e in loader.engines)
    doc = result_document(build_record(out, argv=["ondevice", "bench"], host={}), scenario_results(out))
    res = doc["results"][0]
    assert doc["record"]["incomplete"] is True and (res["repeats"], res["ok_runs"]) == (3, 2)
    assert res["failures"] == [{"repeat": 2, "status": "interrupted", "reason": "interrupted by the user (Ctrl-C)"}]


def test_engine_error_mid_run_is_a_failed_run(tiny_model):
    def boom(engine, i, cancel):
        if i == 1:
            raise RuntimeError("llama_decode returned -3")

    out = run_bench(config([tiny_model], repeats=1), load_fn=FakeLoader(on_token=boom))
    assert out.runs[0].status == "failed" and "llama_decode returned -3" in out.runs[0].reason


def test_progress_events(tiny_model):
    events = []
    run_bench(
        config([tiny_model], scenarios=(WARM_LOAD, RESIDENT, PREFIX_HIT), repeats=2),
        load_fn=FakeLoader(),
        progress=events.append,
    )
    assert events[-1].done == events[-1].total == 6
    assert [e.done for e in events[:-1]] == list(range(6))
