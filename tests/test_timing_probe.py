"""Timing a model's shape on this machine (probing.timing) and caching it (probing.timingcache): what is
timed, that it leaves the caller's engine as it was, the cache key, damage, a busy machine."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from ondevice.probing import plans, timing_for
from ondevice.probing import timing as timing_mod
from ondevice.probing.pairs import paired_differences
from ondevice.probing.plans import TimingPlan, plan_for_engine
from ondevice.probing.timing import time_engine
from ondevice.probing.timingcache import SCHEMA, load_timing, save_timing, timing_key, timing_path
from ondevice.roofline.timing import ShapeTiming

NaN = float("nan")
TINY_PLAN = TimingPlan(name="full", chunks=(1, 4, 16), chain=2, short_prompt=8, decode_steps=4, batch=(2,), rounds=2)


@pytest.fixture(scope="module")
def engine(tiny_model):
    from ondevice.engine import load

    eng = load(tiny_model, n_ctx=256, n_threads=1)
    yield eng
    eng.close()


def test_a_plan_is_cut_to_the_engines_context_and_micro_batch():
    plan = TimingPlan()
    assert plan_for_engine(plan, 4096, 512).chunks == (1, 4, 16, 64, 128, 512)
    assert plan_for_engine(plan, 4096, 256).chunks == (1, 4, 16, 64, 128, 256)
    small = plan_for_engine(plan, 2048, 512).chunks  # (2048 - 16 steps - 8 spare) / (1 + 3 in the chain) = 506
    assert small == (1, 4, 16, 64, 128, 506)


def test_short_chunks_are_the_sizes_below_the_longest_chunk_and_follow_a_cut():
    plan = TimingPlan(chunks=(1, 16, 128), short_chunks=(0, 2, 3, 16, 24, 200))
    assert plan.prefill_chunks == (1, 2, 3, 16, 24, 128)  # sizes the chunks have once, none at or past the longest
    assert plan.tokens - replace(plan, short_chunks=()).tokens == 2 + 3 + 24
    assert plan_for_engine(plan, 4096, 20).prefill_chunks == (1, 2, 3, 16, 20)  # the engine's micro-batch is 20
    assert set(plans.SHORT_CHUNKS) <= set(plans.FULL.prefill_chunks)
    assert set(plans.SHORT_CHUNKS) <= set(plans.QUICK.prefill_chunks)


def test_short_chunks_are_timed_as_prefills_alone(engine):
    plan = replace(TINY_PLAN, short_chunks=(2, 3), rounds=1)
    calls = []
    generate = engine.generate

    def counting(ids, **kw):
        calls.append((len(ids), kw.get("max_tokens")))
        return generate(ids, **kw)

    engine.generate = counting
    try:
        t = time_engine(engine, plan)
    finally:
        del engine.generate
    assert [k for pos, k, _s in t.prefill if pos == 0] == [1, 2, 3, 4, 16]
    assert (2, 1) in calls and (3, 1) in calls  # one llama_decode and its sample, no decode steps after
    assert [n for n, _s in t.decode] == [1 + 2, 4 + 2, 8 + 2, 16 + 2, 32 + 2, 48 + 2]  # no decode points at 2 or 3


def test_timing_an_engine_measures_every_point_of_the_plan(engine):
    t = time_engine(engine, TINY_PLAN)
    assert [k for pos, k, _s in t.prefill if pos == 0] == [1, 4, 16]
    assert [(pos, k) for pos, k, _s in t.prefill if pos] == [(16, 16), (32, 16)]  # the chain of two on top
    # decode after each chunk (4 steps), after the short prompt (its 4 steps), after each link of the chain:
    # at the context of the middle of the steps
    assert [n for n, _s in t.decode] == [1 + 2, 4 + 2, 8 + 2, 16 + 2, 32 + 2, 48 + 2]
    assert [b for b, _s in t.batch] == [2] and t.batch_ctx == 4 + 4  # the batch prompt and half the 8 batch steps
    assert t.n_ubatch == engine.info.n_ubatch and t.plan == "full" and t.source == "model"
    # the CPU's flash attention over the f16 cache: a decode step costs llama.cpp's padded view of the KV cells
    assert (engine.info.backend, engine.info.flash_attn_used, engine.info.cache_type_k) == ("CPU", True, "f16")
    assert (t.kv_pad, t.kv_pad_from) == (256, 512)
    assert t.spread >= 0 and t.other_cpu_cores >= 0 and t.elapsed_s > 0
    assert ShapeTiming.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_a_quantized_kv_cache_is_timed_as_the_cells_in_use(default_model):
    from ondevice.engine import load

    with load(default_model, n_ctx=256, n_threads=1, cache_type_k="q8_0", cache_type_v="q8_0") as eng:
        t = time_engine(eng, replace(TINY_PLAN, rounds=1, batch=()))
    assert (t.kv_pad, t.kv_pad_from) == (1, 0)


def test_timing_leaves_the_callers_seeds_and_cache_alone(engine):
    before = engine.generate("the city", max_tokens=6, temperature=1.0, reuse_prefix=False)
    engine.generate("the city", max_tokens=1, reuse_prefix=False)  # request k+1
    with engine.side_requests():
        engine.generate("x", max_tokens=1)
    time_engine(engine, TINY_PLAN)
    after = engine.generate("the city", max_tokens=6, temperature=1.0, reuse_prefix=False)  # request k+2
    second = engine.generate("the city", max_tokens=6, temperature=1.0, reuse_prefix=False)  # request k+3
    assert after.token_ids != before.token_ids or second.token_ids != before.token_ids  # seeds move per request...
    # ...but the timing requests did not count: a fresh engine making the same user requests draws the same
    from ondevice.engine import load

    fresh = load(engine.info.model_path, n_ctx=256, n_threads=1)
    try:
        seq = [fresh.generate("the city", max_tokens=n, temperature=1.0, reuse_prefix=False) for n in (6, 1, 6, 6)]
    finally:
        fresh.close()
    assert [g.token_ids for g in seq] == [before.token_ids, seq[1].token_ids, after.token_ids, second.token_ids]


def test_timings_are_cached_per_shape_machine_build_and_settings(engine, tmp_path, monkeypatch):
    calls = []
    real = timing_mod.time_engine

    def counting(eng, plan, progress=None):
        calls.append(plan.name)
        return real(eng, replace(TINY_PLAN, name=plan.name, rounds=1), progress=progress)

    monkeypatch.setattr(timing_mod, "time_engine", counting)
    first = timing_for(engine, plan=plans.QUICK, cache_root=tmp_path)
    assert timing_for(engine, plan=plans.QUICK, cache_root=tmp_path) == first and calls == ["quick"]
    full = timing_for(engine, cache_root=tmp_path)  # a quick timing does not serve the full plan
    assert calls == ["quick", "full"] and full.plan == "full"
    assert timing_for(engine, plan=plans.QUICK, cache_root=tmp_path) == full  # the full one serves both
    timing_for(engine, cache_root=tmp_path, refresh=True)
    assert calls == ["quick", "full", "full"]


def test_a_short_context_is_timed_on_a_sibling_with_room_for_the_plan(engine, tmp_path):
    # the key leaves the context out: a timing cut to a quick bench's 256 tokens would serve every context
    from ondevice.probing.plans import plan_context

    plan = replace(TINY_PLAN, chunks=(1, 4, 128), rounds=1, batch=())
    assert plan_context(plan, engine.info.n_ubatch) > engine.info.n_ctx == 256
    assert plan_for_engine(plan, engine.info.n_ctx, engine.info.n_ubatch).chunks != plan.chunks  # what it was
    ids = list(range(1, 40))
    later = ids + list(engine.generate(ids, max_tokens=2, reuse_prefix=False).token_ids) + [5]
    assert engine.cached_prefix(later) == 40
    timing = timing_for(engine, plan=plan, cache_root=tmp_path, refresh=True)
    assert {(pos, k) for pos, k, _s in timing.prefill} >= {(0, 128), (128, 128), (256, 128)}  # uncut, chain too
    assert engine.info.n_ctx == 256 and engine.cached_prefix(later) == 40  # the engine's own cache as it was


def test_the_cache_key_changes_with_what_changes_speed(engine, monkeypatch):
    from ondevice.probing import timingcache

    base = timing_key("shape-a", engine.info)
    assert timing_key("shape-b", engine.info).digest != base.digest
    assert timing_key("shape-a", replace(engine.info, n_threads=7)).digest != base.digest
    assert timing_key("shape-a", replace(engine.info, cache_type_k="q8_0")).digest != base.digest
    assert timing_key("shape-a", replace(engine.info, n_ctx=999)).digest == base.digest  # the window: not speed
    monkeypatch.setattr(timingcache, "build_id", lambda: "another-build")
    assert timing_key("shape-a", engine.info).digest != base.digest
    monkeypatch.undo()
    monkeypatch.setattr(timingcache, "machine_id", lambda: "another-machine")
    assert timing_key("shape-a", engine.info).digest != base.digest


def test_a_model_and_its_renamed_copy_share_the_timing(engine, tiny_model, tmp_path):
    from ondevice.quant.twin import read_header, shape_key

    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(tiny_model.read_bytes())
    assert shape_key(read_header(copy)) == shape_key(read_header(tiny_model))


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"schema": SCHEMA, "timing": {"decode": [[1, "x"]]}}),
        json.dumps({"schema": SCHEMA, "timing": {"decode": [[1, -1]], "prefill": []}}),
        "[" * 100000,
        json.dumps({"schema": SCHEMA, "timing": {"decode": [[1, NaN]]}}),
    ],
)
def test_a_damaged_timing_file_is_measured_again(engine, tmp_path, content, caplog):
    key = timing_key("shape", engine.info)
    path = timing_path(key, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert load_timing(key, tmp_path) is None
    assert "damaged" in caplog.text and str(path) in caplog.text


def test_a_timing_of_an_earlier_schema_is_not_reused(engine, tmp_path, caplog):
    # schema 1 timed twins whose token embedding was zeros: attention ran faster than on real activations
    key = timing_key("shape", engine.info)
    save_timing(key, ShapeTiming(decode=((4, 0.01),), prefill=((0, 4, 0.02),)), tmp_path)
    path = timing_path(key, tmp_path)
    assert load_timing(key, tmp_path) is not None
    path.write_text(path.read_text().replace(f'"schema": {SCHEMA}', '"schema": 1'))
    assert load_timing(key, tmp_path) is None and "damaged" not in caplog.text


def test_a_timing_file_that_is_not_a_regular_file_or_is_huge_is_not_read(engine, tmp_path):
    key = timing_key("shape", engine.info)
    path = timing_path(key, tmp_path)
    path.parent.mkdir(parents=True)
    path.mkdir()  # a directory where the file should be
    assert load_timing(key, tmp_path) is None
    path.rmdir()
    path.write_text(" " * (2 << 20))
    assert load_timing(key, tmp_path) is None


def test_a_busy_machine_still_stores_its_timing_and_says_how_busy(engine, tmp_path):
    hog = subprocess.Popen(
        [sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE
    )
    try:
        assert hog.stdout.readline() == b"spinning\n"  # it runs from here on, whatever the timing takes
        # long enough that the meter's ticks (10 ms) see the hog: a few hundred steps of the tiny model
        t = timing_for(engine, plan=replace(TINY_PLAN, rounds=5, decode_steps=64), cache_root=tmp_path, refresh=True)
    finally:
        hog.kill()
        hog.wait()
    assert t.other_cpu_cores >= 0.5, t  # the hog kept a core busy throughout
    assert load_timing(timing_key(_shape(engine), engine.info), tmp_path) == t  # stored, not thrown away


def _shape(engine):
    from ondevice.quant.twin import read_header, shape_key

    return shape_key(read_header(engine.info.model_path))


def test_saving_is_atomic_and_refuses_a_non_finite_timing(engine, tmp_path):
    key = timing_key("shape", engine.info)
    t = time_engine(engine, replace(TINY_PLAN, rounds=1, batch=()))
    save_timing(key, t, tmp_path)
    assert load_timing(key, tmp_path) == t
    assert [p.name for p in timing_path(key, tmp_path).parent.iterdir()] == [timing_path(key, tmp_path).name]


class _DriftingEngine:
    """A fake engine whose prefill costs `slow` x (new tokens) + 0.001 s x (cached tokens x new tokens / 512):
    the test moves `slow` to play a machine whose speed drifts between two timings."""

    n_vocab = 1000

    def __init__(self, slow: float):
        self.slow, self.cached = slow, []

    def generate(self, ids, *, max_tokens, reuse_prefix, **_kw):
        from types import SimpleNamespace

        kept = len(self.cached) if reuse_prefix and ids[: len(self.cached)] == self.cached else 0
        new = len(ids) - kept
        ttft = self.slow * new + 0.001 * kept * new / 512
        self.cached = list(ids)
        return SimpleNamespace(timings=SimpleNamespace(ttft_s=ttft, tokenize_s=0.0, itl_s=[0.01] * (max_tokens - 1)))


def test_the_chains_attention_is_measured_against_a_prefill_of_the_same_moment():
    plan = TimingPlan(chunks=(1, 512), chain=2, decode_steps=4)
    # the round timed the 512 chunk at 0.512 s; the machine is twice as slow when the chain runs
    points, ids = timing_mod._chain_points(_DriftingEngine(slow=0.002), plan, salt=0, anchor_s=0.512)
    assert len(ids) == 3 * 512
    # each link: the round's figure plus what it took beyond the same chunk prefilled just before it
    assert points[("prefill", 512, 512)] == pytest.approx(0.512 + 0.001 * 512)
    assert points[("prefill", 1024, 512)] == pytest.approx(0.512 + 0.001 * 1024)
    # the machine speeds up fourfold after the base prefill: a link faster than its base adds nothing
    # (attention never makes a chunk faster), it does not subtract from the round's figure
    engine = _DriftingEngine(slow=0.004)
    base_generate = engine.generate

    def speeding_up(ids, **kw):
        out = base_generate(ids, **kw)
        engine.slow = 0.001
        return out

    engine.generate = speeding_up
    faster, _ids = timing_mod._chain_points(engine, plan, salt=0, anchor_s=0.5)
    assert [t for key, t in sorted(faster.items()) if key[0] == "prefill"] == [0.5, 0.5]


def test_a_chain_right_after_its_chunk_is_measured_against_that_chunk_without_prefilling_it_again():
    plan = TimingPlan(chunks=(1, 512), chain=2, decode_steps=4)
    engine = _DriftingEngine(slow=0.001)
    chunk = timing_mod.probe_ids(engine.n_vocab, 512, 512)  # the round's chunk point (salt 0), just timed
    engine.generate(chunk, max_tokens=6, reuse_prefix=False)
    calls = []
    real = engine.generate
    engine.generate = lambda ids, **kw: calls.append(len(ids)) or real(ids, **kw)
    points, ids = timing_mod._chain_points(engine, plan, salt=0, anchor_s=0.512, just_timed=True)
    assert calls == [1024, 1536]  # the links alone: the cache still held the chunk
    # a link: the chunk's figure plus what it took beyond it (the attention over the 512 cached tokens)
    assert points[("prefill", 512, 512)] == pytest.approx(0.512 + 0.001 * 512)
    assert ids[:512] == chunk


def test_the_twins_decode_difference_is_a_robust_line_over_the_contexts():
    # the 3-block twin's decode took 10 ms more than the 1-block one, and 1 us more per token of context;
    # one point's few steps landed on a busy moment (+30 ms)
    diffs = {("decode", ctx): [0.010 + 1e-6 * ctx] for ctx in (3, 18, 24, 130, 514)}
    diffs[("decode", 130)] = [0.040]
    diffs[("prefill", 0, 16)] = [0.2, 0.3, 0.1]
    shared = paired_differences(diffs)
    for ctx in (3, 18, 24, 130, 514):
        assert shared[("decode", ctx)] == pytest.approx(0.010 + 1e-6 * ctx)
    assert shared[("prefill", 0, 16)] == pytest.approx(0.2)  # other points: the median of their own pairs


def test_the_twins_decode_difference_takes_its_level_from_the_long_paired_bursts():
    # the per-point differences say 14 ms (their few steps each), the long alternating bursts 10 ms at context 40
    diffs = {("decode", ctx): [0.014 + 1e-6 * ctx] for ctx in (3, 18, 130, 514)}
    diffs[("blocks", 40)] = [0.010 + 1e-6 * 40, 0.011 + 1e-6 * 40, 0.030]  # one burst on a busy moment
    shared = paired_differences(diffs)
    assert ("blocks", 40) not in shared
    for ctx in (3, 18, 130, 514):
        assert shared[("decode", ctx)] == pytest.approx(0.011 + 1e-6 * ctx)


def test_the_twins_decode_difference_without_decode_points_is_the_bursts_level_at_their_context():
    diffs = {("blocks", 24): [0.010, 0.012, 0.030], ("prefill", 0, 16): [0.2, 0.3, 0.1]}
    shared = paired_differences(diffs)
    assert shared == {("decode", 24): pytest.approx(0.012), ("prefill", 0, 16): pytest.approx(0.2)}


def test_an_engines_long_context_decode_is_paired_with_a_short_one_on_a_sibling(engine, monkeypatch):
    """The decode after the chain: the short-context decode point plus what the long context added, measured in steps
    alternating with another engine on the same model at a short context, so from the same moments (a machine that
    slowed between the short point and the chain moves neither)."""
    pairs = []

    def bursts(long_engine, long_ids, short_engine, short_ids, steps):
        pairs.append((long_engine, short_engine, short_engine._h.model, len(long_ids), len(short_ids), steps))
        return 0.005 + 0.003, 0.005  # the long context adds 3 ms a step

    monkeypatch.setattr(timing_mod, "_decode_bursts", bursts)
    decode = dict(time_engine(engine, TINY_PLAN).decode)
    short, longest = 8 + 4 // 2, 48 + 4 // 2  # the short prompt's steps; the chain (16 + 2 x 16) and its steps
    assert decode[longest] == pytest.approx(decode[short] + 0.003)
    assert len(pairs) == TINY_PLAN.rounds
    for long_engine, short_engine, its_model, n_long, n_short, steps in pairs:
        assert long_engine is engine and short_engine is not engine and its_model == engine._h.model
        assert (n_long, n_short, steps) == (48, 8, 4)
    assert pairs[0][1]._closed  # closed after the timing; the engine goes on
    assert engine.generate([1, 40], max_tokens=2, ignore_eos=True).token_ids


def test_a_long_context_measured_faster_than_the_short_one_adds_nothing(engine, monkeypatch):
    """Noise can make the long-context bursts the faster ones, by more than a tiny model's whole short step: the
    timing still stands, the long context adding nothing (a decode point of no time or less is not a timing)."""
    monkeypatch.setattr(timing_mod, "_decode_bursts", lambda *_a: (0.001, 1.0))  # long 999 ms faster than short
    decode = dict(time_engine(engine, TINY_PLAN).decode)
    short, longest = 8 + 4 // 2, 48 + 4 // 2
    assert decode[longest] == pytest.approx(decode[short])


def test_a_whole_models_third_round_times_only_what_the_first_two_disagree_on(engine, monkeypatch):
    """With min_rounds, a model timed whole (time_engine) takes a third round only when its first two disagree, and
    then only on the points they disagree on: a chunk alone, or the chain again on a fresh prefill of its chunk."""
    plan = replace(TINY_PLAN, batch=(), rounds=3, min_rounds=2)
    asked: list[tuple[int, bool]] = []  # (prompt tokens, prefix reused) of every prompt timed
    real = timing_mod.first_token_s
    monkeypatch.setattr(
        timing_mod,
        "first_token_s",
        lambda eng, ids, reuse, max_tokens=1: asked.append((len(ids), reuse)) or real(eng, ids, reuse, max_tokens),
    )
    seen: dict[str, tuple[list, list[str]]] = {}
    for name, disagree in (("none", set()), ("chunk", {("chunk", 4)}), ("chain", {("chain",)})):
        monkeypatch.setattr(timing_mod, "unsteady", lambda _rounds, _figures, d=disagree: d)
        asked.clear()
        said: list[str] = []
        timing = time_engine(engine, plan, progress=said.append)
        seen[name] = (list(asked), [line for line in said if "round" in line])
        assert {(pos, k) for pos, k, _s in timing.prefill} == {(0, 1), (0, 4), (0, 16), (16, 16), (32, 16)}
    two, rounds = seen["none"]
    assert len(rounds) == 2  # the first two agree: no third
    for name, third in (("chunk", [(4, False)]), ("chain", [(16, False), (32, True), (48, True)])):
        asked_here, rounds_here = seen[name]
        assert asked_here[: len(two)] == two and asked_here[len(two) :] == third, name
        assert len(rounds_here) == 3 and "disagree" in rounds_here[2]


def test_a_whole_models_points_disagree_when_their_rounds_spread_more_than_ten_percent():
    from ondevice.probing.pairs import unsteady

    rounds = [
        {("prefill", 0, 16): 0.100, ("decode", 10): 0.010, ("prefill", 16, 16): 0.20, ("decode", 50): 0.012},
        {("prefill", 0, 16): 0.105, ("decode", 10): 0.012, ("prefill", 16, 16): 0.21},
    ]
    figures = {
        ("chunk", 16): {("prefill", 0, 16)},  # 5% apart: steady
        ("short",): {("decode", 10)},  # 20% apart
        ("chain",): {("prefill", 16, 16), ("decode", 50)},  # the decode after it timed once: nothing to disagree
        ("batch", 2): {("batch", 2)},  # never timed: timed again
    }
    assert unsteady(rounds, figures) == {("short",), ("batch", 2)}
    assert unsteady(rounds[:1], figures) == {("batch", 2)}
