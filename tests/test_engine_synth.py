"""The engine on tiny random synthetic models: determinism, timing identities, KV reuse, cancel, busy."""

from __future__ import annotations

import threading

import pytest

from ondevice.core.errors import EngineBusyError
from ondevice.engine import EngineInfo, load
from ondevice.gguf.spec import ModelSpec

PROMPT = "the people of the world are in the city of paris and"


def greedy(engine, prompt=PROMPT, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("ignore_eos", True)
    return engine.generate(prompt, temperature=0, **kw)


def test_engine_info(engine, tiny_model, offload_backend):
    info = engine.info
    assert isinstance(info, EngineInfo) and isinstance(info.spec, ModelSpec)
    assert info.model_path == str(tiny_model) and info.spec.path == str(tiny_model)
    assert info.backend == offload_backend  # "CPU" on a CPU-only build; a GPU build offloads every layer
    assert info.n_gpu_layers == (0 if offload_backend == "CPU" else info.spec.n_layer + 1)
    assert info.n_ctx == engine.n_ctx == 256 and info.n_threads == 1
    assert info.n_batch == 256  # asked 512; llama.cpp caps n_batch at n_ctx
    assert info.load_s > 0 and info.llama_cpp_version


def test_greedy_is_deterministic(engine):
    a = greedy(engine, reuse_prefix=False)
    b = greedy(engine, reuse_prefix=False)
    c = greedy(engine)  # prefix hit: the whole prompt and its last logits come from the cache
    assert a.token_ids == b.token_ids == c.token_ids
    assert len(a.token_ids) == 24 and a.finish_reason == "length"
    assert c.cached_prompt_tokens == c.prompt_tokens and c.timings.prompt_tokens_computed == 0


def test_timing_identities(engine):
    stream = engine.stream(PROMPT, max_tokens=16, temperature=0, ignore_eos=True, reuse_prefix=False)
    events = list(stream)
    g = stream.generation
    t = g.timings
    T = len(events)
    assert T == t.output_tokens == len(g.token_ids) == 16
    assert len(t.itl_s) == T - 1
    assert t.tpot_s == pytest.approx((t.e2e_s - t.ttft_s) / (T - 1))
    assert t.tpot_s == pytest.approx(sum(t.itl_s) / (T - 1))
    assert t.ttft_s >= t.tokenize_s + t.prefill_s
    assert all(b.t_s > a.t_s for a, b in zip(events, events[1:]))
    assert events[0].t_s == pytest.approx(t.ttft_s) and events[-1].t_s == pytest.approx(t.e2e_s)
    assert [e.index for e in events] == list(range(T))
    assert [e.n_ctx_used for e in events] == [g.prompt_tokens + i for i in range(T)]
    assert t.prompt_tokens_computed == g.prompt_tokens and g.cached_prompt_tokens == 0
    assert t.decode_tok_s == pytest.approx(1 / t.tpot_s) and t.prefill_tok_s > 0
    assert "".join(e.text for e in events) == g.text
    assert all(e.predicted_step_s is None for e in events) and g.predicted_tok_s is None


def test_prefill_in_small_chunks_matches_one_batch(tiny_model):
    long_prompt = " ".join([PROMPT] * 3)
    with load(tiny_model, n_ctx=256, n_threads=1, n_batch=7) as small:
        a = greedy(small, long_prompt, max_tokens=12)
    with load(tiny_model, n_ctx=256, n_threads=1) as big:
        b = greedy(big, long_prompt, max_tokens=12)
    assert a.prompt_tokens == b.prompt_tokens > 7
    assert a.token_ids == b.token_ids


def cache_positions(engine):
    """Positions llama.cpp's cache holds for sequence 0 (its own count, not the engine's)."""
    h = engine._h
    return int(h.lib.llama_memory_seq_pos_max(h.memory, 0)) + 1


def test_prefix_reuse_and_kv_bookkeeping(engine):
    first = greedy(engine, PROMPT, max_tokens=5, reuse_prefix=False)
    assert engine.kv_cache_tokens == first.prompt_tokens + 5 - 1  # the last sampled token is never decoded
    assert cache_positions(engine) == engine.kv_cache_tokens
    ids = engine.tokenize(PROMPT)
    longer = ids + engine.tokenize(" and more", add_bos=False)
    g = engine.generate(longer, max_tokens=3, temperature=0)
    assert g.cached_prompt_tokens == len(ids)
    assert g.timings.prompt_tokens_computed == len(longer) - len(ids)
    cold = engine.generate(longer, max_tokens=3, temperature=0, reuse_prefix=False)
    assert cold.cached_prompt_tokens == 0 and cold.token_ids == g.token_ids
    assert cache_positions(engine) == engine.kv_cache_tokens
    engine.reset()
    assert engine.kv_cache_tokens == 0 == cache_positions(engine)


def test_cancel_from_another_thread_then_engine_still_usable(engine):
    baseline = greedy(engine, max_tokens=40, reuse_prefix=False)
    stream = engine.stream(PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
    seen = []
    for ev in stream:
        seen.append(ev)
        if ev.index == 3:
            t = threading.Thread(target=engine.cancel)
            t.start()
            t.join()
    g = stream.generation
    assert g.finish_reason == "cancelled" and len(seen) == 4 == len(g.token_ids)
    assert g.token_ids == baseline.token_ids[:4]
    assert "".join(e.text for e in seen) == g.text
    assert not engine.busy
    again = greedy(engine, max_tokens=40, reuse_prefix=False)
    assert again.token_ids == baseline.token_ids


def test_cancel_event_passed_in(engine):
    cancel = threading.Event()
    stream = engine.stream(PROMPT, max_tokens=40, temperature=0, ignore_eos=True, cancel=cancel)
    for ev in stream:
        if ev.index == 1:
            threading.Thread(target=cancel.set).start()
            cancel.wait()
    assert stream.generation.finish_reason == "cancelled" and len(stream.generation.token_ids) == 2


def test_cancel_before_the_first_token(engine):
    cancel = threading.Event()
    cancel.set()
    g = engine.generate(PROMPT, max_tokens=5, cancel=cancel)
    assert g.finish_reason == "cancelled" and g.token_ids == () and g.text == ""
    assert g.timings.output_tokens == 0 and g.timings.itl_s == ()


def test_cancel_when_idle_does_not_leak_into_the_next_request(engine):
    engine.cancel()
    g = greedy(engine, max_tokens=3)
    assert g.finish_reason == "length"


def test_close_stops_early_and_keeps_the_generation(engine):
    stream = engine.stream(PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
    first = next(stream)
    stream.close()
    assert first.index == 0
    assert stream.generation.finish_reason == "cancelled" and len(stream.generation.token_ids) == 1
    assert list(stream) == [] and not engine.busy


def test_unstarted_stream_closed_releases_the_engine(engine):
    stream = engine.stream(PROMPT, max_tokens=4)
    assert engine.busy
    stream.close()
    assert not engine.busy and stream.generation.finish_reason == "cancelled"


def test_second_generation_while_busy_is_refused(engine):
    stream = engine.stream(PROMPT, max_tokens=10, temperature=0, ignore_eos=True)
    next(stream)
    kv_before = engine.kv_cache_tokens
    with pytest.raises(EngineBusyError):
        engine.stream("another", max_tokens=2)
    errors = []

    def other_thread():
        try:
            engine.generate("another", max_tokens=2)
        except EngineBusyError as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(errors) == 1
    with pytest.raises(EngineBusyError):
        engine.reset()
    with pytest.raises(EngineBusyError):
        engine.close()
    assert engine.kv_cache_tokens == kv_before  # the running request's cache was not touched
    rest = list(stream)
    assert len(rest) == 9 and stream.generation.finish_reason == "length"
    assert greedy(engine, max_tokens=2).finish_reason == "length"


def test_generate_after_chat_turn_is_deterministic(engine):
    baseline = greedy(engine, max_tokens=20, reuse_prefix=False)
    chat = engine.chat(temperature=0, max_tokens=6)
    chat.send("hello you")
    assert greedy(engine, max_tokens=20).token_ids == baseline.token_ids


def test_sampled_generation_reproducible_with_seed(engine):
    a = engine.generate(PROMPT, max_tokens=12, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, ignore_eos=True)
    b = engine.generate(PROMPT, max_tokens=12, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, ignore_eos=True)
    assert a.token_ids == b.token_ids


class FakePredictor:
    def __init__(self):
        self.calls = []

    def step_s(self, n_ctx):
        self.calls.append(n_ctx)
        return 1e-3 + 1e-6 * n_ctx, 2e-3 + 1e-6 * n_ctx


def test_predictor_fills_events_and_generation(tiny_model):
    pred = FakePredictor()
    with load(tiny_model, n_ctx=256, n_threads=1, predictor=pred) as eng:
        assert eng.predictor is pred
        stream = eng.stream(PROMPT, max_tokens=6, temperature=0, ignore_eos=True)
        events = list(stream)
    g = stream.generation
    assert [e.predicted_step_s for e in events] == pytest.approx([2e-3 + 1e-6 * e.n_ctx_used for e in events])
    assert g.predicted_step_s == pytest.approx(tuple(e.predicted_step_s for e in events))
    decode_ctx = [e.n_ctx_used for e in events[1:]]
    mean_ceil = sum(1e-3 + 1e-6 * n for n in decode_ctx) / len(decode_ctx)
    mean_cal = sum(2e-3 + 1e-6 * n for n in decode_ctx) / len(decode_ctx)
    assert g.ceiling_tok_s == pytest.approx(1 / mean_ceil) and g.predicted_tok_s == pytest.approx(1 / mean_cal)
    assert g.efficiency == pytest.approx(g.timings.decode_tok_s / g.predicted_tok_s)


def test_predictor_auto_resolves_through_the_api(tiny_model, monkeypatch, offload_backend):
    import ondevice.api as api

    seen = []
    sentinel = FakePredictor()

    def fake_default(engine, progress=None, *, full=False, refresh=False):
        seen.append((engine.info.spec.path, engine.info.backend, full, refresh))
        return sentinel

    monkeypatch.setattr(api, "auto_predictor", fake_default)
    with api.load(tiny_model, n_ctx=256, n_threads=1) as eng:
        assert eng.predictor is sentinel
    with api.load(tiny_model, n_ctx=256, n_threads=1, timing="full", retime=True):
        pass
    assert seen == [(str(tiny_model), offload_backend, False, False), (str(tiny_model), offload_backend, True, True)]


def test_llama_log_goes_to_logging_not_the_terminal(tiny_model_f32, caplog, capfd):
    import logging

    with caplog.at_level(logging.DEBUG, logger="ondevice.llama_cpp"):
        with load(tiny_model_f32, n_ctx=256, n_threads=1) as eng:
            eng.generate("hello", max_tokens=3)
    assert any(r.name == "ondevice.llama_cpp" for r in caplog.records)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_tokenize_detokenize_round_trip(engine):
    ids = engine.tokenize("the city of paris")
    assert ids[0] == 1 and engine.tokenize("the city of paris", add_bos=False) == ids[1:]
    assert engine.detokenize(ids[1:]).strip() == "the city of paris"
    assert engine.detokenize([]) == ""


def test_cache_bookkeeping_heals_after_an_unrecorded_step(engine):
    greedy(engine, max_tokens=10, reuse_prefix=False)
    held = list(engine._kv.tokens)
    engine._kv.tokens.pop()  # as if an exception landed between llama_decode and its record
    ids = held + engine.tokenize(" and", add_bos=False)
    warm = engine.generate(ids, max_tokens=8, temperature=0, ignore_eos=True)
    assert warm.cached_prompt_tokens == len(held) - 1
    assert cache_positions(engine) == engine.kv_cache_tokens == len(ids) + 8 - 1
    cold = engine.generate(ids, max_tokens=8, temperature=0, ignore_eos=True, reuse_prefix=False)
    assert warm.token_ids == cold.token_ids


def test_consumer_exception_releases_the_engine(engine):
    import gc

    def consume():
        for _ev in engine.stream(PROMPT, max_tokens=20, temperature=0):
            raise RuntimeError("consumer failed")

    with pytest.raises(RuntimeError):
        consume()
    gc.collect()
    assert not engine.busy
    assert greedy(engine, max_tokens=2).finish_reason == "length"


def test_leaving_a_for_loop_early_frees_the_engine(engine):
    stream = engine.stream(PROMPT, max_tokens=20, temperature=0, ignore_eos=True)
    for ev in stream:  # noqa: B007 - the caller still holds the stream: only leaving the loop says it is done
        break
    assert not engine.busy
    assert greedy(engine, max_tokens=3).finish_reason == "length"  # the next request right away
    g = stream.generation
    assert g.finish_reason == "cancelled" and g.token_ids == (ev.token_id,)
    assert list(stream) == []


def test_with_block_and_dropped_streams_free_the_engine(engine):
    with engine.stream(PROMPT, max_tokens=20, temperature=0, ignore_eos=True) as stream:
        first = next(stream)
    assert not engine.busy and stream.generation.token_ids == (first.token_id,)
    stream = engine.stream(PROMPT, max_tokens=20)
    next(stream)
    del stream  # abandoned mid-generation: its finalizer ends it
    assert not engine.busy
    it = iter(engine.stream(PROMPT, max_tokens=20))
    next(it)
    it.close()  # an iterator closed as a generator is
    assert not engine.busy and greedy(engine, max_tokens=2).finish_reason == "length"
