"""Speculative decoding (ondevice.engine.speculative): the choice of k, the drafters, and end to end
that the output is plain decoding's token for token (stop strings and end-of-generation inside a
draft too), that rolled-back drafts leave the KV cache as plain decoding leaves it, and that the
timing identities hold. Bad input is refused before any work."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.cli.main import main
from ondevice.core.errors import InvalidParameterError, ModelNotFoundError
from ondevice.engine import load
from ondevice.engine.drafters import PromptLookup, check_same_vocab
from ondevice.engine.speculative import KPlanner, StepCost, expected_committed, spec_settings
from tests._engine_models import BOS, EOS, build_successor_model, successor_engine, token_id

SP = "\u2581"
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "from"]
CHAIN = [token_id(SP + w) for w in WORDS] + [EOS]


@pytest.fixture
def always_draft(monkeypatch):
    """Every step drafts as many tokens as allowed: the verify path runs on every step, deterministically."""

    def choose(self, kind, k_cap, n_ctx):
        k = min(k_cap, self.k_max) if kind is not None else 0
        return (k, 1.0, 1.0)

    monkeypatch.setattr(KPlanner, "choose", choose)


# ---- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"speculative": "lookup", "draft": None, "spec_k": -1}, "spec_k"),
        ({"speculative": "lookup", "draft": None, "spec_k": 65}, "spec_k"),
        ({"speculative": "lookup", "draft": None, "spec_k": True}, "spec_k"),
        ({"speculative": "lookup", "draft": None, "spec_k": 2.0}, "spec_k"),
        ({"speculative": "medusa", "draft": None, "spec_k": None}, "speculative"),
        ({"speculative": "draft", "draft": None, "spec_k": None}, "draft model"),
        ({"speculative": "lookup", "draft": "d.gguf", "spec_k": None}, "no draft model"),
        ({"speculative": None, "draft": None, "spec_k": 4}, "spec_k needs"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, needle):
    with pytest.raises(InvalidParameterError, match=needle):
        spec_settings(**kwargs)


def test_settings_defaults_and_draft_alone():
    assert spec_settings(None, None, None) is None
    s = spec_settings("lookup", None, None)
    assert (s.mode, s.k_max, s.draft) == ("lookup", 16, None)
    assert spec_settings(None, "small.gguf", 0) == spec_settings("draft", "small.gguf", 0)
    assert spec_settings("lookup", None, 64).k_max == 64


def test_expected_committed_is_the_geometric_sum():
    assert expected_committed(0.0, 5) == 1.0
    assert expected_committed(1.0, 4) == 5.0
    assert math.isclose(expected_committed(0.5, 2), 1 + 0.5 + 0.25)
    assert math.isclose(expected_committed(0.9, 16), sum(0.9**i for i in range(17)))


def test_prompt_lookup_drafts_what_followed_the_longest_latest_match():
    pl = PromptLookup()
    assert pl.candidate() is None
    pl.extend([1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3])
    assert pl.candidate() == 2  # "2 3" was followed by 4 and then by 5: the latest wins
    assert pl.draft(3) == [5, 6, 7]
    pl.extend([5])
    assert pl.candidate() == 3  # "2 3 5" seen before
    assert pl.draft(2) == [6, 7]
    pl2 = PromptLookup()
    pl2.extend([8, 1, 2, 1, 2])  # "1 2" last followed by "1": past the end the draft repeats the loop
    assert pl2.candidate() == 2 and pl2.draft(5) == [1, 2, 1, 2, 1]
    pl3 = PromptLookup()
    pl3.extend([4, 5, 6, 7])
    assert pl3.candidate() is None  # no token seen twice: nothing to draft


class _Cost:
    """A StepCost stand-in: a decode of n tokens costs 1 + slope (n - 1) plain steps."""

    def __init__(self, slope: float, plain: int = 5):
        self.slope, self.plain_samples = slope, plain

    def step_ratio(self, n_ctx, k, committed):
        return 1.0 + self.slope * k


def test_planner_drafts_deep_when_verifying_is_cheap_and_drafts_land():
    p = KPlanner(16, _Cost(0.05))
    for _ in range(20):
        p.update("x", 8, 8)
    k, e, c = p.choose("x", 16, 100)
    assert k >= 8 and e > 5 and c == pytest.approx(1 + 0.05 * k)
    assert p.choose(None, 16, 100)[0] == 0  # nothing to draft
    assert p.choose("x", 0, 100)[0] == 0  # no room left (max_tokens)


def test_planner_falls_to_plain_when_drafts_miss_and_probes_with_backoff():
    p = KPlanner(16, _Cost(0.3))
    for _ in range(20):
        p.update("x", 2, 0)
    picks = [p.choose("x", 16, 100)[0] for _ in range(16 + 32 + 5)]
    tries = [i for i, k in enumerate(picks) if k]
    assert tries == [15, 47]  # tried again after 16 chances, then after 32


def test_planner_never_probes_when_even_perfect_drafts_cannot_pay():
    p = KPlanner(4, _Cost(1.0))  # verifying k drafts costs k + 1 plain steps: at best a tie
    assert all(p.choose("x", 4, 100)[0] == 0 for _ in range(100))


def test_planner_waits_for_plain_steps_first():
    assert KPlanner(8, _Cost(0.0, plain=0)).choose("x", 8, 10)[0] == 0


def test_step_cost_uses_measured_sizes_and_a_line_between():
    c = StepCost(None)
    assert c.decode_ratio(100, 5) == pytest.approx(1 + 4 * StepCost.PRIOR_SLOPE)  # nothing measured yet
    for _ in range(3):
        c.record(1, 10e6, 1, 0.0, 0, 0.0)
        c.record(5, 30e6, 2, 0.0, 4, 0.0)
    assert c.decode_ratio(100, 5) == pytest.approx(3.0)  # measured
    assert c.decode_ratio(100, 3) == pytest.approx(2.0)  # on the line through (1, 10 ms) and (5, 30 ms)
    assert c.step_ratio(100, 4, 5.0) == pytest.approx(3.0)  # sampling and drafting measured as free here
    assert c.step_ratio(100, 0, 1.0) == 1.0


def test_step_cost_prefers_the_predictor_for_unmeasured_sizes():
    pred = SimpleNamespace(
        step_s=lambda n: (1.0, 1.0), tokens_step_s=lambda n_ctx, n, n_seqs=1: 0.01 * (1 + 0.1 * (n - 1))
    )
    c = StepCost(pred)
    assert c.decode_ratio(100, 9) == pytest.approx(1.8)


class _FakeLib:
    """llama_token_to_piece and BOS/EOS over per-vocab token tables."""

    def __init__(self, tables):
        self.tables = tables

    def llama_token_to_piece(self, vocab, token, buf, size, lstrip, special):
        data = self.tables[vocab][token].encode()
        buf.raw = data + b"\0" * (size - len(data))
        return len(data)

    def llama_vocab_bos(self, vocab):
        return 1

    def llama_vocab_eos(self, vocab):
        return 2


def test_same_size_vocabularies_with_other_texts_are_refused():
    a = [f"t{i}" for i in range(600)]
    b = list(a)
    b[300] = "other"
    lib = _FakeLib({"a": a, "b": b})
    target = SimpleNamespace(lib=lib, vocab="a", n_vocab=600)
    check_same_vocab(target, SimpleNamespace(lib=lib, vocab="a", n_vocab=600), "same.gguf")
    with pytest.raises(InvalidParameterError, match="token 300"):
        check_same_vocab(target, SimpleNamespace(lib=lib, vocab="b", n_vocab=600), "other.gguf")
    with pytest.raises(InvalidParameterError, match="600"):
        check_same_vocab(target, SimpleNamespace(lib=lib, vocab="b", n_vocab=512), "small.gguf")


# ---- a synthetic model whose greedy output is known: drafts that land, stops inside them ---------


@pytest.fixture(scope="module")
def succ(tmp_path_factory):
    yield from successor_engine(tmp_path_factory.mktemp("spec"), [CHAIN])


def _prompt(start: int = 0) -> list[int]:
    """The chain once (so lookup can draft it), then its first tokens: greedy continues the chain."""
    return [BOS] + CHAIN + CHAIN[: start + 1]


def _both(engine, ids, **kw):
    plain = engine.generate(ids, temperature=0, reuse_prefix=False, **kw)
    kv_plain = engine.kv_cache_tokens
    spec = engine.generate(ids, temperature=0, reuse_prefix=False, speculative="lookup", **kw)
    assert engine.kv_cache_tokens == kv_plain  # rolled-back drafts leave the cache as plain decoding does
    return plain, spec


def _same(plain, spec):
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason


@pytest.mark.parametrize("start", [0, 1, 2, 3])
def test_end_of_generation_inside_a_draft_ends_where_plain_ends(succ, always_draft, start):
    plain, spec = _both(succ, _prompt(start), max_tokens=40)
    _same(plain, spec)
    assert plain.finish_reason == "stop" and plain.token_ids[-1] == EOS
    s = spec.speculative
    assert s.k_cap >= 1 and s.steps >= 1 and s.accepted >= 1  # the drafts were verified, and landed
    assert s.accepted + s.steps + s.plain_steps == len(spec.token_ids) - 1  # every step commits accepted + 1


@pytest.mark.parametrize("stop_at", [1, 2, 3, 4, 5])
def test_stop_string_inside_a_draft_ends_where_plain_ends(succ, always_draft, stop_at):
    ids = _prompt(0)  # output: CHAIN[1], CHAIN[2], ...
    stop = " " + WORDS[1 + stop_at]  # the text of output token `stop_at`
    plain, spec = _both(succ, ids, max_tokens=40, stop=stop)
    _same(plain, spec)
    assert plain.finish_reason == "stop" and len(plain.token_ids) == stop_at + 1
    k = spec.speculative.k_cap
    if (stop_at - 1) % (k + 1) < k:  # the stop token sat before the end of its verify batch
        assert spec.speculative.drafted > spec.speculative.accepted


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8])
def test_max_tokens_ends_where_plain_ends(succ, always_draft, max_tokens):
    plain, spec = _both(succ, _prompt(0), max_tokens=max_tokens)
    _same(plain, spec)
    assert len(spec.token_ids) == max_tokens and spec.finish_reason == "length"


def test_timing_identities_hold_with_bursts(succ, always_draft):
    stream = succ.stream(_prompt(0), max_tokens=40, temperature=0, reuse_prefix=False, speculative="lookup")
    events = list(stream)
    g = stream.generation
    t = g.timings
    n = len(g.token_ids)
    assert n >= 8 and t.output_tokens == n == len(events)
    assert len(t.itl_s) == n - 1 and all(x >= 0 for x in t.itl_s)
    assert t.tpot_s == pytest.approx((t.e2e_s - t.ttft_s) / (n - 1))
    assert sum(t.itl_s) == pytest.approx(t.e2e_s - t.ttft_s)
    assert [e.index for e in events] == list(range(n))
    assert events[0].t_s == pytest.approx(t.ttft_s) and events[-1].t_s == pytest.approx(t.e2e_s)
    assert [b.t_s - a.t_s for a, b in zip(events, events[1:])] == pytest.approx(list(t.itl_s))
    a = g.attribution  # the parts add up to E2E in the speculative loop too
    assert a.decode_s > 0 and a.sample_s > 0 and a.overhead_s > -1e-3
    assert (
        a.tokenize_s
        + a.prefill_s
        + a.first_sample_s
        + a.decode_s
        + a.sample_s
        + a.detokenize_s
        + a.consumer_s
        + a.overhead_s
        == pytest.approx(t.e2e_s)
    )
    d = g.to_dict()["speculative"]
    assert d["acceptance_rate"] == pytest.approx(g.speculative.accepted / g.speculative.drafted)


def test_adaptive_choice_still_gives_plain_output(succ):
    plain, spec = _both(succ, _prompt(1), max_tokens=40)
    _same(plain, spec)
    assert spec.speculative.predicted_speedup is not None


def test_cli_run_shows_acceptance_and_refuses_bad_k(tmp_path, capsys):
    path = build_successor_model(
        tmp_path / "cli.gguf", [[token_id(SP + "of"), token_id(SP + "hello"), token_id(SP + "world"), EOS]]
    )
    rc = main(
        [
            "run",
            str(path),
            " of hello world of",
            "-t",
            "0",
            "-n",
            "8",
            "-c",
            "256",
            "--threads",
            "1",
            "--no-predict",
            "--speculative",
            "lookup",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out == " hello world\n"
    assert "speculative lookup:" in err and "committed" in err
    for argv, needle in (
        (["--speculative", "lookup", "--spec-k", "65"], "spec_k"),
        (["--speculative", "lookup", "--spec-k", "-1"], "spec_k"),
        (["--draft", str(tmp_path / "missing.gguf")], "no such file"),
        (["--speculative", "draft"], "draft model"),
    ):
        rc = main(["run", str(path), "x", "-c", "256", "--threads", "1", "--no-predict"] + argv)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err


# ---- the default model --------------------------------------------------------------------------

PROMPTS = [
    "The Eiffel Tower is located in the city of",
    "Repeat the sentence exactly.\nSentence: It is a truth universally acknowledged, that a single man in possession "
    "of a good fortune, must be in want of a wife.\nRepeated: It is a truth",
    "Count: one, two, three, four, five, six,",
    "Q: Name three primary colours.\nA:",
]


@pytest.fixture(scope="module")
def gemma(default_model):
    with load(default_model, n_ctx=1024) as eng:
        yield eng


@pytest.fixture(scope="module")
def gemma_draft(default_model, tmp_path_factory):
    """A tiny random llama with the default model's tokenizer: its drafts are mostly wrong."""
    cfg = SynthConfig(tokenizer_from=str(default_model), n_layer=1, tied_output=True, n_ctx_train=32768, name="draft")
    return build_synthetic_model(cfg, tmp_path_factory.mktemp("draft") / "gemma-draft.gguf")


@pytest.mark.default_model
@pytest.mark.parametrize("prompt", PROMPTS)
def test_default_model_lookup_is_lossless(gemma, always_draft, prompt):
    plain = gemma.generate(prompt, max_tokens=40, temperature=0, reuse_prefix=False)
    spec = gemma.generate(prompt, max_tokens=40, temperature=0, reuse_prefix=False, speculative="lookup")
    _same(plain, spec)
    assert spec.speculative.k_cap >= 1 and spec.speculative.steps >= 1


@pytest.mark.default_model
def test_default_model_lookup_drafts_land_on_copied_text(gemma, always_draft):
    spec = gemma.generate(PROMPTS[1], max_tokens=24, temperature=0, reuse_prefix=False, speculative="lookup")
    assert spec.speculative.accepted >= 4


@pytest.mark.default_model
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_default_model_synthetic_draft_is_lossless(gemma, gemma_draft, always_draft, prompt):
    plain = gemma.generate(prompt, max_tokens=24, temperature=0, reuse_prefix=False)
    spec = gemma.generate(prompt, max_tokens=24, temperature=0, reuse_prefix=False, draft=gemma_draft)
    _same(plain, spec)
    s = spec.speculative
    assert s.mode == "draft" and s.steps >= 1 and s.drafted > s.accepted


@pytest.mark.default_model
def test_rollback_leaves_the_prefix_a_following_request_reuses(gemma, always_draft):
    ids = gemma.tokenize(PROMPTS[1])
    more = gemma.tokenize(" Then", add_bos=False)
    results = []
    for spec in (None, "lookup"):
        first = gemma.generate(ids, max_tokens=20, temperature=0, reuse_prefix=False, speculative=spec)
        assert gemma.kv_cache_tokens == len(ids) + len(first.token_ids) - 1
        follow = gemma.generate(ids + list(first.token_ids) + more, max_tokens=12, temperature=0)
        assert follow.cached_prompt_tokens == len(ids) + len(first.token_ids) - 1
        results.append((first.token_ids, follow.token_ids))
    assert results[0] == results[1]


@pytest.mark.default_model
def test_default_model_bad_input_before_any_work(gemma, tiny_model, tmp_path):
    gemma.generate("Hello", max_tokens=2, temperature=0)
    before = gemma.kv_cache_tokens
    for kw, err, needle in (
        ({"speculative": "lookup", "spec_k": -1}, InvalidParameterError, "spec_k"),
        ({"speculative": "lookup", "spec_k": 65}, InvalidParameterError, "spec_k"),
        ({"draft": str(tmp_path / "missing.gguf")}, ModelNotFoundError, "no such file"),
        ({"draft": str(tiny_model)}, InvalidParameterError, "vocabulary"),
    ):
        with pytest.raises(err, match=needle):
            gemma.stream("Hello there", max_tokens=4, **kw)
        assert not gemma.busy and gemma.kv_cache_tokens == before


def test_chat_turns_take_the_speculative_setting(succ):
    from ondevice.tui.session import ChatSettings

    s = ChatSettings(temperature=0.0, max_tokens=8, speculative="lookup").validated()
    assert s.sampling()["speculative"] == "lookup" and "speculative" not in ChatSettings().sampling()
    with pytest.raises(InvalidParameterError, match="speculative"):
        ChatSettings(speculative="draft").validated()
    chat = succ.chat(temperature=0, max_tokens=8)
    g = chat.send("of the and", **{k: v for k, v in s.sampling().items() if k != "temperature"})
    assert g.speculative is not None and g.speculative.mode == "lookup"
    assert succ.chat(temperature=0, max_tokens=8).send("of the and").token_ids == g.token_ids
    with pytest.raises(InvalidParameterError, match="spec_k"):
        chat.send("x", speculative="lookup", spec_k=99)


def test_leaving_the_stream_inside_a_burst_cancels_there(succ, always_draft):
    ids = _prompt(0)
    stream = succ.stream(ids, max_tokens=40, temperature=0, reuse_prefix=False, speculative="lookup")
    for i, _ in enumerate(stream):
        if i == 2:  # token 2 arrives inside the first verify step's burst
            break
    g = stream.generation
    assert g.finish_reason == "cancelled" and len(g.token_ids) == 3 and not succ.busy
    assert succ.kv_cache_tokens == len(ids) + 2  # as plain decoding leaves it: the last token not decoded
    follow = succ.generate(ids + list(g.token_ids), max_tokens=4, temperature=0)
    assert follow.cached_prompt_tokens == len(ids) + 2 and list(follow.token_ids) == CHAIN[4:8]
