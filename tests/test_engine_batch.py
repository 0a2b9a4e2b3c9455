"""Batched decoding (ondevice.engine.batch): several sequences per llama_decode, each as its own request.

On the successor model (tests/_engine_models.py) the output of every sequence is known token by
token, so stops, end-of-generation and drop-outs are exact; the default model checks that greedy
output in a batch is each prompt's own single-sequence output.
"""

from __future__ import annotations

import pytest

from ondevice.core.errors import ContextOverflowError, EngineBusyError, EngineError, InvalidParameterError
from ondevice.engine import load
from tests._engine_models import BOS, EOS, chain_text, successor_engine, token_id

SP = "\u2581"


@pytest.fixture(scope="module")
def chains():
    of, hello, world, you = token_id(SP + "of"), token_id(SP + "hello"), token_id(SP + "world"), token_id(SP + "you")
    the, a, b = token_id(SP + "the"), token_id("a"), token_id("b")
    return {
        "words": [of, hello, world, token_id("!"), you, EOS],  # 4 tokens, then EOS
        "eos_first": [token_id(SP + "city"), EOS],  # EOS at once
        "loop": [the, a, b, the],  # never ends: the a b the a b ...
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory, chains):
    yield from successor_engine(tmp_path_factory.mktemp("succ"), list(chains.values()))


def prompts(chains, *names):
    return [[BOS, chains[n][0]] for n in names]


# ---- stops, drop-outs, timing identities -------------------------------------------------
def test_each_sequence_follows_its_chain_and_finished_ones_drop_out(engine, chains):
    batch = engine.batched(3, 64)
    bg = batch.generate(prompts(chains, "words", "eos_first", "loop"), 8, temperature=0)
    words, eos, loop = bg.generations
    assert list(words.token_ids) == chains["words"][1:] and words.finish_reason == "stop"
    assert words.text == chain_text(chains["words"][1:]).decode()
    assert list(eos.token_ids) == [EOS] and eos.finish_reason == "stop" and eos.text == ""
    assert len(loop.token_ids) == 8 and loop.finish_reason == "length"
    # first tokens come from the prefill; then a step per further token of each live sequence
    assert bg.step_seqs == (2, 2, 2, 2, 1, 1, 1)
    assert sum(bg.step_seqs) + 3 == bg.output_tokens == 5 + 1 + 8
    assert len(bg.step_s) == len(bg.step_seqs)


def test_timing_identities_per_sequence(engine, chains):
    bg = engine.batched(3, 64).generate(prompts(chains, "words", "loop", "loop"), 6, temperature=0, ignore_eos=True)
    assert bg.step_seqs == (3,) * 5
    for g in bg.generations:
        t = g.timings
        assert t.output_tokens == len(g.token_ids) == 6
        assert len(t.itl_s) == t.output_tokens - 1
        assert t.tpot_s == pytest.approx((t.e2e_s - t.ttft_s) / (t.output_tokens - 1))
        assert t.tpot_s == pytest.approx(sum(t.itl_s) / len(t.itl_s))
        assert t.prompt_tokens_computed == g.prompt_tokens == 2 and g.cached_prompt_tokens == 0
        assert 0 < t.prefill_s <= t.ttft_s <= t.e2e_s <= bg.wall_s
    ttfts = [g.timings.ttft_s for g in bg.generations]
    assert ttfts == sorted(ttfts)  # prompts are prefilled in order
    assert bg.decode_tok_s == pytest.approx(15 / sum(bg.step_s))
    assert bg.output_tok_s == pytest.approx(18 / bg.wall_s)
    assert bg.prefill_s <= bg.wall_s
    d = bg.to_dict()
    assert d["n_seqs"] == 3 and d["output_tokens"] == 18 and len(d["generations"]) == 3


def test_ignore_eos_and_stop_strings_per_sequence(engine, chains):
    bg = engine.batched(2, 64).generate(prompts(chains, "words", "words"), 4, temperature=0, stop=" world")
    assert [g.text for g in bg.generations] == [" hello", " hello"]
    assert all(g.finish_reason == "stop" and len(g.token_ids) == 2 for g in bg.generations)
    bg = engine.batched(1, 64).generate(prompts(chains, "eos_first"), 4, temperature=0, ignore_eos=True)
    assert len(bg.generations[0].token_ids) == 4 and bg.generations[0].finish_reason == "length"


def test_max_tokens_zero_prefills_only(engine, chains):
    bg = engine.batched(2, 64).generate(prompts(chains, "words", "loop"), 0)
    assert bg.output_tokens == 0 and bg.step_s == () and bg.decode_tok_s is None
    assert all(g.finish_reason == "length" for g in bg.generations)


def test_seeded_draws_repeat_and_fewer_prompts_than_sequences(engine, chains):
    batch = engine.batched(4, 64)
    kw = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True)
    a = batch.generate([[BOS, 10], [BOS, 11]], 6, **kw)
    b = batch.generate([[BOS, 10], [BOS, 11]], 6, **kw)
    assert [g.token_ids for g in a.generations] == [g.token_ids for g in b.generations]
    assert a.n_seqs == 2


# ---- prediction ----------------------------------------------------------------------------
class BatchedPredictor:
    def __init__(self):
        self.calls = []

    def step_s(self, n_ctx):
        return 1e-3, 2e-3

    def tokens_step_s(self, n_ctx, n_tokens, n_seqs=1):
        self.calls.append((n_ctx, n_tokens, n_seqs))
        return 2e-3 + 1e-4 * n_seqs

    def ceiling_tokens_step_s(self, n_ctx, n_tokens, n_seqs=1):
        return 1e-3 + 1e-5 * n_seqs


def test_prediction_from_the_batched_step_model(engine, chains):
    pred = BatchedPredictor()
    engine.predictor = pred
    try:
        bg = engine.batched(4, 64).generate(
            [[BOS, 10, 11, 12], [BOS, 10]] + prompts(chains, "loop"), 8, ignore_eos=True
        )
    finally:
        engine.predictor = None
    assert pred.calls == [(3 + 4, 1, 3)]  # mean prompt 3 tokens + half of 8 outputs; 3 sequences, 1 token each
    assert bg.predicted_step_s == pytest.approx(2.3e-3) and bg.ceiling_step_s == pytest.approx(1.03e-3)
    assert bg.predicted_decode_tok_s == pytest.approx(3 / 2.3e-3)
    assert bg.ceiling_decode_tok_s == pytest.approx(3 / 1.03e-3)
    assert all(g.predicted_tok_s == pytest.approx(1 / 2.3e-3) for g in bg.generations)


def test_no_prediction_without_the_batched_step_model(engine, chains):
    class StepOnly:
        def step_s(self, n_ctx):
            return 1e-3, 2e-3

    engine.predictor = StepOnly()
    try:
        bg = engine.batched(2, 64).generate(prompts(chains, "loop", "loop"), 4)
    finally:
        engine.predictor = None
    assert bg.predicted_step_s is None and bg.predicted_decode_tok_s is None and bg.ceiling_step_s is None


# ---- bad input, busy, close -----------------------------------------------------------------
@pytest.mark.parametrize("n_seqs", [0, -1, 257, True, 2.0, "4"])
def test_bad_sequence_counts(engine, n_seqs):
    with pytest.raises(InvalidParameterError, match="n_seqs"):
        engine.batched(n_seqs, 64)


def test_sequence_longer_than_the_trained_context(engine):
    assert engine.info.spec.n_ctx_train == 512
    with pytest.raises(InvalidParameterError, match="trained context of 512"):
        engine.batched(2, 513)
    with pytest.raises(InvalidParameterError, match="seq_tokens"):
        engine.batched(2, 0)
    assert engine.batched(2, 512).n_ctx_seq == 512
    assert engine.batched(2).n_ctx_seq == engine.n_ctx  # default: the engine's context per sequence


def test_bad_prompts_fail_before_any_work(engine, chains):
    batch = engine.batched(2, 64)
    with pytest.raises(InvalidParameterError, match="3 prompts: this batch context holds 2"):
        batch.generate(prompts(chains, "words", "words", "words"), 4)
    with pytest.raises(InvalidParameterError, match="prompt 1 is empty"):
        batch.generate([[BOS, 10], []], 4)
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        batch.generate([], 4)
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        batch.generate("a text, not a list", 4)
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        batch.generate([[BOS, 10**6]], 4)
    with pytest.raises(ContextOverflowError, match="256 tokens each sequence"):
        batch.generate([[BOS, 10], [BOS] * 250], 8)
    with pytest.raises(InvalidParameterError, match="unknown sampling setting"):
        batch.generate([[BOS, 10]], 4, temprature=0)
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        batch.generate([[BOS, 10]], -1)
    assert not engine.busy


class _PollHook:
    """A cancel event whose is_set() counts its polls (one per prefill chunk, one per decode step)
    and runs `at_poll(n)`: cancellation at an exact point, with no timing."""

    def __init__(self, at_poll):
        self.polls = 0
        self.at_poll = at_poll

    def is_set(self) -> bool:
        self.polls += 1
        return bool(self.at_poll(self.polls))


def test_cancel_between_decode_steps_keeps_what_was_produced(engine, chains):
    hook = _PollHook(lambda n: n > 3 + 2)  # 3 prefill chunks, then 2 decode steps
    bg = engine.batched(3, 64).generate(prompts(chains, "loop", "loop", "words"), 16, temperature=0, cancel=hook)
    assert bg.step_seqs == (3, 3)
    assert [g.finish_reason for g in bg.generations] == ["cancelled"] * 3
    assert [len(g.token_ids) for g in bg.generations] == [3, 3, 3]
    assert list(bg.generations[2].token_ids) == chains["words"][1:4]


def test_cancel_during_prefill_leaves_later_prompts_without_output(engine, chains):
    hook = _PollHook(lambda n: n > 1)  # the first prompt's chunk, then cancelled
    bg = engine.batched(2, 64).generate(prompts(chains, "loop", "words"), 8, temperature=0, cancel=hook)
    first, second = bg.generations
    assert first.finish_reason == second.finish_reason == "cancelled"
    assert len(first.token_ids) == 1 and second.token_ids == () and bg.step_s == ()
    assert second.timings.prompt_tokens_computed == 0 and second.timings.prefill_s >= 0
    assert first.timings.prompt_tokens_computed == 2


def test_engine_cancel_reaches_a_running_batch(engine, chains):
    batch = engine.batched(2, 64)
    hook = _PollHook(lambda n: engine.cancel() if n == 2 + 3 else False)  # the engine cancels during step 3
    bg = batch.generate(prompts(chains, "loop", "loop"), 32, temperature=0, cancel=hook)
    assert bg.step_seqs == (2, 2, 2) and {g.finish_reason for g in bg.generations} == {"cancelled"}
    batch.cancel()  # idle: nothing to stop, and the next run is not cancelled
    assert batch.generate(prompts(chains, "loop"), 4, temperature=0).generations[0].finish_reason == "length"
    with pytest.raises(InvalidParameterError, match="cancel must be"):
        batch.generate(prompts(chains, "loop"), 4, cancel=True)


def test_busy_engine_and_close(tiny_model):
    eng = load(tiny_model, n_ctx=256, n_threads=1)
    batch = eng.batched(2, 64)
    stream = eng.stream([BOS, 10], max_tokens=4, ignore_eos=True)
    next(stream)  # the engine is generating
    with pytest.raises(EngineBusyError):
        batch.generate([[BOS, 10]], 2)
    stream.close()
    assert batch.generate([[BOS, 10]], 2).output_tokens == 2
    eng.close()
    assert batch.closed
    with pytest.raises(EngineError, match="closed"):
        batch.generate([[BOS, 10]], 2)
    with pytest.raises(EngineError, match="closed"):
        eng.batched(2, 64)


# ---- the default model: a batch gives each prompt its own greedy output ----------------------
DEFAULT_PROMPTS = (
    "The Eiffel Tower is located in the city of",
    "Write a short poem about the sea and the ships:\n",
    "Once upon a time, in a small village by the river, there lived an old clockmaker who",
)


@pytest.fixture(scope="module")
def default_engine(default_model):
    with load(default_model, n_ctx=512) as eng:
        yield eng


@pytest.mark.default_model
def test_batch_greedy_output_equals_single_output(default_engine):
    ids = [default_engine.tokenize(p) for p in DEFAULT_PROMPTS]
    assert len({len(i) for i in ids}) == 3  # prompts of different lengths
    singles = [default_engine.generate(i, max_tokens=24, temperature=0, reuse_prefix=False) for i in ids]
    bg = default_engine.batched(3, 128).generate(list(DEFAULT_PROMPTS), 24, temperature=0)
    for single, g in zip(singles, bg.generations):
        assert g.token_ids == single.token_ids
        assert g.text == single.text and g.finish_reason == single.finish_reason
        assert g.prompt_tokens == single.prompt_tokens
