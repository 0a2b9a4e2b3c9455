"""A hybrid model (LFM2: short-convolution blocks with a recurrent state, a few attention blocks) through the product:
only the attention blocks have a KV cache and count attention cells; the twins keep its mix of blocks or time it
whole; the engine reuses its cache only where all of it is a prefix of the new prompt (llama.cpp cannot cut a
recurrent state back), so every request gives reuse_prefix=False's output; the timing's chain of chunks reuses what
each link left; speculative decoding is refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import leading_blocks, matching_blocks, reduce_layers, write_twin

from ondevice.core.errors import InvalidParameterError
from ondevice.gguf.spec import inspect
from ondevice.probing.twins import twin_blocks, window_period
from ondevice.roofline.attention import chunk_cells, decode_spans
from tests.hf_headers import CONFIGS

KINDS = ["conv", "full_attention", "conv", "conv"]  # the tiny model's blocks
SAMPLED = dict(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)  # a draw that any other state would move


def _lfm2(**change) -> dict:
    return json.loads((CONFIGS / "lfm2-1.2b.json").read_text()) | change


@pytest.fixture(scope="module")
def tiny_lfm2(synth_dir) -> Path:
    cfg = _lfm2(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, block_ff_dim=192)
    cfg |= {"num_hidden_layers": 4, "vocab_size": 512, "max_position_embeddings": 4096, "layer_types": KINDS}
    return write_twin(header_from_hf_config(cfg), synth_dir / "tiny-lfm2.gguf")


@pytest.fixture(scope="module")
def engine(tiny_lfm2):
    from ondevice.engine import load

    eng = load(tiny_lfm2, n_ctx=2048, n_threads=1)
    yield eng
    eng.close()


def assert_tiny_hybrid_runs(path: Path):
    """A tiny hybrid model loads, generates and gives finite, varied logits, llama.cpp taking it as recurrent (no
    window); its spec (the builder tests of LFM2 and Granite-H check the rest)."""
    from ondevice.engine import load
    from ondevice.llama.logits import LogitsModel

    with load(path, n_ctx=256, n_threads=1) as eng:
        g = eng.generate("hello there", max_tokens=4, temperature=0, ignore_eos=True)
        assert eng.info.recurrent
    assert len(g.timings.itl_s) == 3
    with LogitsModel(path, n_ctx=256, n_threads=1) as m:
        logits = m.window_logits([1, 300, 301, 302], 1)
        assert m._h.recurrent and m._h.n_swa == 0
    assert np.isfinite(logits).all() and logits.std() > 0
    return inspect(path)


# ---------- the spec: which layers have a KV cache ----------


def test_only_the_attention_layers_have_a_kv_cache_and_attend(tmp_path):
    spec = inspect(write_twin(header_from_hf_config(_lfm2()), tmp_path / "lfm2.gguf", sparse=True))
    assert spec.attention_layers == (2, 5, 8, 10, 12, 14)
    per_layer = 2 * 2 * 8 * 64  # f16 K and V, 8 heads of 64
    assert spec.kv_bytes_per_token_by_layer == tuple(per_layer if i in spec.attention_layers else 0 for i in range(16))
    assert spec.kv_bytes_per_token == 6 * per_layer and spec.n_head_kv == 8
    assert spec.kv_read_bytes(1000) == 1000 * 6 * per_layer
    assert spec.with_kv_cache("q8_0", "q8_0").kv_bytes_per_token_by_layer.count(0) == 10  # still no cache there
    assert decode_spans(spec, 1000) == 6 * 1000  # cells a step works through: 6 layers attend, not 16
    one_layer = replace(spec, n_layer=1, kv_bytes_per_token_by_layer=())
    assert chunk_cells(spec, 100, 10) == 6 * chunk_cells(one_layer, 100, 10)
    unknown = replace(spec, kv_bytes_per_token_by_layer=())  # no per-layer sizes: every layer counts, as before
    assert unknown.attention_layers == tuple(range(16)) and decode_spans(unknown, 10) == 160


# ---------- the twins: the layer pattern's period ----------


def test_an_irregular_hybrid_is_timed_whole_and_a_periodic_one_on_twins_of_its_period(tmp_path):
    spec = inspect(write_twin(header_from_hf_config(_lfm2()), tmp_path / "lfm2.gguf", sparse=True))
    big = replace(spec, weight_bytes=8 << 30)  # as large as twins are for
    assert window_period(spec) == 16 and twin_blocks(big) is None  # attention at 2, 5, 8, 10, 12, 14: no period
    periodic = _lfm2(num_hidden_layers=12, layer_types=["conv", "conv", "full_attention"] * 4)
    header = header_from_hf_config(periodic)
    spec = replace(inspect(write_twin(header, tmp_path / "p.gguf", sparse=True)), weight_bytes=8 << 30)
    # the convolutions before the first attention block recur: no lead, twins of one and three periods
    assert window_period(spec) == 3 and leading_blocks(header) == 0 and twin_blocks(spec, 0) == (3, 9)
    dense = replace(spec, kv_bytes_per_token_by_layer=(4096,) * 12)
    assert window_period(dense) == 1 and twin_blocks(dense) == (1, 3)


def test_twin_blocks_take_their_types_from_blocks_of_their_own_kind():
    """(quant.twin.matching_blocks matches each twin block among the model's blocks holding the same tensor names.)"""
    header = header_from_hf_config(_lfm2(num_hidden_layers=12, layer_types=["conv", "conv", "full_attention"] * 4))
    for k in (3, 9):
        picks = matching_blocks(header, k)
        assert [p % 3 == 2 for p in picks] == [i % 3 == 2 for i in range(k)]  # attention stands for attention
        twin = reduce_layers(header, k, picks)  # (a conv block would have no attention tensor to take a type from)
        assert twin.value("lfm2.attention.head_count_kv") == tuple(8 if i % 3 == 2 else 0 for i in range(k))


# ---------- the engine: prefix reuse on a recurrent state ----------


def test_a_prompt_that_extends_the_cache_reuses_it(engine):
    a = engine.generate(list(range(1, 40)), reuse_prefix=False, **SAMPLED)
    longer = list(range(1, 40)) + list(a.token_ids[:-1]) + [77, 78, 79]  # the cache holds all but the last output
    assert engine.cached_prefix(longer) == 50
    reused = engine.generate(longer, reuse_prefix=True, **SAMPLED)
    assert reused.cached_prompt_tokens == 50
    assert reused.token_ids == engine.generate(longer, reuse_prefix=False, **SAMPLED).token_ids


@pytest.mark.parametrize("shared", [1, 20, 38])
def test_a_prompt_that_shares_part_of_the_cache_starts_from_empty(engine, shared):
    ids = list(range(1, 40))
    engine.generate(ids, reuse_prefix=False, **SAMPLED)
    other = ids[:shared] + [300, 301, 302]
    assert engine.cached_prefix(other) == 0  # what a prediction of its TTFT counts as cached
    g = engine.generate(other, reuse_prefix=True, **SAMPLED)
    assert g.cached_prompt_tokens == 0
    assert g.token_ids == engine.generate(other, reuse_prefix=False, **SAMPLED).token_ids


def test_a_repeated_prompt_reuses_only_a_cache_that_holds_just_it(engine):
    ids = list(range(1, 40))
    engine.generate(ids, reuse_prefix=False, **SAMPLED)  # the cache holds the prompt and 11 outputs
    again = engine.generate(ids, reuse_prefix=True, **SAMPLED)
    assert again.cached_prompt_tokens == 0
    engine.generate(ids, reuse_prefix=False, max_tokens=1, ignore_eos=True)  # the prompt alone, its logits kept
    whole = engine.generate(ids, reuse_prefix=True, **SAMPLED)
    assert whole.cached_prompt_tokens == 39 and whole.token_ids == again.token_ids


def test_a_state_ahead_of_the_recorded_tokens_is_not_reused(engine):
    """A token decoded but not recorded (an exception between the two): the state cannot go back to the tokens."""
    ids = list(range(1, 40))
    engine.generate(ids, reuse_prefix=False, max_tokens=1, ignore_eos=True)
    engine._kv.tokens.pop()  # the bookkeeping one short of what the state took in
    engine._kv.drop_prompt_logits()
    g = engine.generate(ids + [5, 6], reuse_prefix=True, **SAMPLED)
    assert g.cached_prompt_tokens == 0
    assert g.token_ids == engine.generate(ids + [5, 6], reuse_prefix=False, **SAMPLED).token_ids


def test_speculative_decoding_is_refused(engine):
    assert engine.info.recurrent
    with pytest.raises(InvalidParameterError, match="cannot drop rejected drafts|recurrent state cannot"):
        engine.generate("hello", max_tokens=4, speculative="lookup")


def test_a_dense_model_is_not_recurrent(tiny_model):
    from ondevice.engine import load

    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        assert not eng.info.recurrent


# ---------- the timing: the chain of chunks reuses what each link left ----------


def test_the_timing_chain_reuses_each_link(engine, monkeypatch):
    assert_chain_reuses_each_link(engine, monkeypatch)


def assert_chain_reuses_each_link(engine, monkeypatch) -> None:
    """The timing's chain on a recurrent engine: each link a chunk on top of the one before (the Granite-H tests run
    it on a Mamba-2 hybrid)."""
    from ondevice.probing import plans, timing

    asked: list[tuple[int, int]] = []
    first_token_s = timing.first_token_s

    def spy(eng, ids, reuse, max_tokens=1):
        t, g = first_token_s(eng, ids, reuse, max_tokens)
        if reuse:
            asked.append((len(ids), g.cached_prompt_tokens))
        return t, g

    monkeypatch.setattr(timing, "first_token_s", spy)
    plan = replace(plans.QUICK, chunks=(16, 64), chain=3)
    # the round's longest chunk was the last request, decode steps after it (what _shared_points leaves)
    spy(engine, timing.probe_ids(engine.n_vocab, 64, 64), False, 6)
    points, ids = timing._chain_points(engine, plan, 0, anchor_s=0.01, just_timed=True)
    assert asked == [(128, 64), (192, 128), (256, 192)]  # each link on top of the one before, nothing recomputed
    assert {("prefill", 64, 64), ("prefill", 128, 64), ("prefill", 192, 64)} <= points.keys() and len(ids) == 256


def test_the_bench_says_why_a_prefix_hit_found_nothing_cached(engine):
    from ondevice.bench import scenarios as sc
    from ondevice.bench.oscache import PeakRss

    ctx = sc.RequestContext(engine, "tiny-lfm2", 0, {"temperature": 0.0}, None, PeakRss())
    ids = list(range(1, 40))
    rec = sc.prefix_hit_run(ctx, "short", ids[:30], ids[30:], [300, 301, 302], 4, 0)
    assert rec.cached_prompt_tokens == 0
    assert "only 0 of 30 prefix tokens were cached (a recurrent state is not cut back to a prefix)" in rec.notes


def test_info_names_the_blocks_that_attend(tiny_lfm2, tiny_model, capsys):
    from ondevice.cli.main import main

    assert main(["info", str(tiny_lfm2)]) == 0
    assert "  layers          4 (1 attend: 1; the rest recurrent, no KV cache)\n" in capsys.readouterr().out
    assert main(["info", str(tiny_model)]) == 0
    assert "  layers          2\n" in capsys.readouterr().out


# ---------- the recurrent state: its bytes as llama.cpp allocates them, in the bound ----------


@pytest.mark.parametrize("kind", ["lfm2", "granite-h"])
def test_the_recurrent_state_is_what_llama_cpp_allocates_and_the_ceiling_reads_it(kind, synth_dir):
    """ModelSpec.state_bytes against llama.cpp's recurrent-state (RS) buffer for one sequence: LFM2's short
    convolutions (d_model x (l_cache - 1) a layer) and Granite-H's Mamba-2 layers (the convolution state and the SSM
    state, d_state x d_inner); the bound's step reads it beside the weights and the KV cache."""
    from ondevice.cli.info import render
    from ondevice.core.fmt import human_bytes
    from ondevice.engine import load
    from ondevice.llama.log import log_listener
    from ondevice.llama.memlog import parse_buffer_log
    from ondevice.roofline import Calibration, Predictor
    from tests.test_twin_hfconfig_granite_h import TINY, _config

    # states of about a MiB (llama.cpp logs buffer sizes to a hundredth of one): a long convolution, a wide SSM state
    if kind == "lfm2":
        cfg = _lfm2(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, block_ff_dim=192, conv_L_cache=257)
        cfg |= {"num_hidden_layers": 4, "vocab_size": 512, "max_position_embeddings": 4096, "layer_types": KINDS}
        expected = 4 * 256 * 256 * KINDS.count("conv")
    else:
        cfg = _config() | TINY | {"hidden_size": 256, "mamba_d_state": 256, "mamba_n_heads": 16}
        cfg |= {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}
        expected = 4 * 3 * ((4 - 1) * (512 + 2 * 1 * 256) + 256 * 512)  # d_conv 4, d_inner 512, 1 group
    path = write_twin(header_from_hf_config(cfg), synth_dir / f"{kind}-state.gguf")
    spec = inspect(path)
    lines: list[str] = []
    with log_listener(lines.append), load(path, n_ctx=256, n_threads=1):
        pass
    logged = parse_buffer_log(lines).total_bytes("RS")
    assert spec.state_bytes == expected and logged == pytest.approx(expected, rel=0.01)
    (line,) = [line for line in render(spec).splitlines() if "recurrent state" in line]
    assert f"{human_bytes(expected)} a sequence" in line
    bound = Predictor(spec, Calibration("CPU", ceiling_gbs=10.0))
    assert bound.step_bytes(64) == spec.decode_weight_bytes + spec.kv_read_bytes(64) + spec.state_bytes


def test_a_model_without_recurrent_layers_keeps_no_state(tiny_model):
    assert inspect(tiny_model).state_bytes == 0
