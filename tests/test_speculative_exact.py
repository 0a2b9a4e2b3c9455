"""Speculative decoding exact or for speed: exact=True gives plain decoding's output on synthetic models,
exact=False lifts the bit-identical cap; the token agreement with the paired plain run (from scripted
outputs), the speedup predicted from k and the acceptance, k within its bounds, and bad input refused
with one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ondevice.bench import speculative as bench_spec
from ondevice.bench.runs import SPECULATIVE
from ondevice.bench.scenarios import RequestContext
from ondevice.bench.speculative import spec_rows, spec_summary, speculative_run, token_agreement
from ondevice.cli.main import main
from ondevice.core.errors import InvalidParameterError
from ondevice.core.metrics import timings_from_marks
from ondevice.core.results import Generation, SpecStats
from ondevice.engine import speculative as spec_mod
from ondevice.engine.speculative import (
    DEFAULT_EXACT,
    KPlanner,
    StepCost,
    expected_committed,
    spec_settings,
    speedup_at_acceptance,
)
from tests._engine_models import BOS, EOS, build_successor_model, successor_engine, token_id

SP = "\u2581"
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "from"]
CHAIN = [token_id(SP + w) for w in WORDS] + [EOS]


# ---- settings and bad input ------------------------------------------------------------------------


def test_exact_is_a_boolean_and_defaults():
    assert spec_settings("lookup", None, None).exact is DEFAULT_EXACT
    assert spec_settings("lookup", None, 4, True).exact is True
    assert spec_settings("lookup", None, 4, False).exact is False


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"speculative": "lookup", "draft": None, "spec_k": None, "exact": "yes"}, "exact must be True or False"),
        ({"speculative": "lookup", "draft": None, "spec_k": None, "exact": 1}, "exact must be True or False"),
        ({"speculative": "lookup", "draft": None, "spec_k": None, "exact": 1.0}, "exact must be True or False"),
        ({"speculative": None, "draft": None, "spec_k": None, "exact": True}, "exact needs"),
        ({"speculative": "lookup", "draft": None, "spec_k": -1, "exact": False}, "spec_k"),
    ],
)
def test_bad_settings_refused(kwargs, needle):
    with pytest.raises(InvalidParameterError, match=needle):
        spec_settings(**kwargs)


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("exact") / "cli.gguf"
    return build_successor_model(path, [[token_id(SP + "of"), token_id(SP + "hello"), token_id(SP + "world"), EOS]])


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--speculative", "lookup", "--spec-exact", "maybe"], "--spec-exact must be on or off"),
        (["--speculative", "lookup", "--spec-exact", "1"], "--spec-exact must be on or off"),
        (["--spec-exact", "on"], "--spec-exact needs"),
        (["--speculative", "lookup", "--spec-k", "-1", "--spec-exact", "off"], "spec_k"),
    ],
)
def test_cli_run_refuses_bad_exact_with_one_line(cli_model, capsys, argv, needle):
    rc = main(["run", str(cli_model), "x", "-c", "256", "--threads", "1", "--no-predict"] + argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--scenarios", "speculative", "--spec-exact", "yes"], "--spec-exact must be on or off"),
        (["--scenarios", "resident", "--spec-exact", "off"], "needs the speculative scenario"),
    ],
)
def test_cli_bench_refuses_bad_exact_with_one_line(cli_model, capsys, argv, needle):
    rc = main(["bench", str(cli_model), "-p", "8", "-n", "4", "--no-progress"] + argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_cli_run_says_which_kind(cli_model, capsys):
    base = ["run", str(cli_model), " of hello world of", "-t", "0", "-n", "8", "-c", "256", "--threads", "1"]
    for flag, word in (("on", "exact"), ("off", "k for speed")):
        rc = main(base + ["--no-predict", "--speculative", "lookup", "--spec-exact", flag])
        out, err = capsys.readouterr()
        assert rc == 0 and out == " hello world\n"
        assert f"speculative lookup: {word}," in err


# ---- exact output on synthetic models --------------------------------------------------------------


@pytest.fixture(scope="module")
def succ(tmp_path_factory):
    yield from successor_engine(tmp_path_factory.mktemp("succ"), [CHAIN])


@pytest.fixture
def always_draft(monkeypatch):
    """Every step drafts as many tokens as allowed, so the verify path runs on every step."""

    def choose(self, kind, k_cap, n_ctx):
        return (min(k_cap, self.k_max) if kind is not None else 0, 1.0, 1.0)

    monkeypatch.setattr(KPlanner, "choose", choose)


@pytest.mark.parametrize("start", [0, 2, 5])
def test_exact_true_output_is_plain_decodings_on_the_successor_model(succ, always_draft, start):
    ids = [BOS] + CHAIN + CHAIN[: start + 1]
    plain = succ.generate(ids, temperature=0, reuse_prefix=False, max_tokens=40)
    spec = succ.generate(ids, temperature=0, reuse_prefix=False, max_tokens=40, speculative="lookup", exact=True)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason
    s = spec.speculative
    assert s.exact is True and s.steps >= 1 and s.accepted >= 1


def test_exact_true_output_is_plain_decodings_on_a_random_model(engine, always_draft):
    """The tiny random model: its greedy text is arbitrary, repeats are what lookup drafts from."""
    for prompt in ([1, 5, 9, 5, 9, 5, 9, 5], [1, 7, 7, 7, 7, 7], [1, 300, 2, 300, 2, 300]):
        plain = engine.generate(prompt, temperature=0, reuse_prefix=False, max_tokens=24, ignore_eos=True)
        spec = engine.generate(
            prompt, temperature=0, reuse_prefix=False, max_tokens=24, ignore_eos=True, speculative="lookup", exact=True
        )
        assert spec.token_ids == plain.token_ids
        assert spec.speculative.exact is True


def test_exact_caps_k_where_the_batch_check_says_and_fast_does_not(succ, monkeypatch):
    """exact=True takes the measured bit-identical cap; exact=False is bounded by spec_k only."""
    calls = []

    def measured(handle, info, tokenize, want):
        calls.append(want)
        return 3  # verify batches of up to 3 tokens (k <= 2) give single-token logits

    monkeypatch.setattr(spec_mod, "exact_verify_tokens", measured)
    monkeypatch.setattr(succ, "_exact", (1, 1))  # not measured yet on this engine
    assert succ.speculator("lookup", None, 8, True).k_cap == 2 and calls == [9]
    assert succ.speculator("lookup", None, 8, False).k_cap == 8 and calls == [9]
    assert succ.speculator("lookup", None, 8, False).settings.exact is False
    fast = succ.generate([BOS] + CHAIN + CHAIN[:1], max_tokens=12, temperature=0, speculative="lookup", exact=False)
    assert fast.speculative.exact is False and fast.speculative.k_cap == spec_mod.DEFAULT_K_MAX


def test_chat_takes_exact(succ):
    chat = succ.chat(temperature=0, max_tokens=8)
    g = chat.send("of the and", speculative="lookup", exact=False)
    assert g.speculative is not None and g.speculative.exact is False
    with pytest.raises(InvalidParameterError, match="exact must be True or False"):
        chat.send("x", speculative="lookup", exact="no")


# ---- k within bounds ---------------------------------------------------------------------------------


class _FlatCost(StepCost):
    """A verify of k drafts costs 1 + slope * k plain steps; two plain decodes measured."""

    def __init__(self, slope: float):
        super().__init__(None)
        self.slope = slope
        for _ in range(KPlanner.PLAIN_FIRST):
            self.record(1, 1e6, 1, 1e4, 0, 0)

    def step_ratio(self, n_ctx, k, committed):
        return 1.0 + self.slope * k


@pytest.mark.parametrize("slope", [0.0, 0.05, 0.5, 2.0])
@pytest.mark.parametrize("k_max, k_cap", [(16, 64), (16, 3), (4, 16), (0, 8), (16, 0)])
def test_k_is_chosen_within_its_bounds(slope, k_max, k_cap):
    planner = KPlanner(k_max, _FlatCost(slope))
    for accepted in (0, 1, 3, 8):
        planner.update(3, 8, accepted)
        for _ in range(40):  # past the re-probe interval too
            k, expected, cost = planner.choose(3, k_cap, 100)
            assert 0 <= k <= min(k_max, k_cap)
            assert expected == pytest.approx(expected_committed(planner.acceptance(3), k)) or k == 0


def test_k_for_speed_grows_with_acceptance_when_verifying_is_cheap():
    planner = KPlanner(16, _FlatCost(0.01))
    for _ in range(30):
        planner.update(3, 16, 16)  # every draft accepted
    assert planner.choose(3, 16, 100)[0] == 16


# ---- the speedup predicted from k and the acceptance ---------------------------------------------------


def test_speedup_at_acceptance_arithmetic():
    # 3 verify steps of k=2 at a = 0.5 commit 1.75 each; 4 plain steps commit 1 each; cost 10 plain steps
    assert speedup_at_acceptance({2: 3}, 4, 0.5, 10.0) == pytest.approx((3 * 1.75 + 4) / 10.0)
    assert speedup_at_acceptance({}, 5, None, 5.0) == pytest.approx(1.0)
    assert speedup_at_acceptance({}, 0, None, 0.0) is None
    assert speedup_at_acceptance({3: 1}, 0, None, 2.0) is None


def test_stats_carry_the_speedup_at_the_measured_acceptance(succ, always_draft):
    g = succ.generate([BOS] + CHAIN + CHAIN[:1], max_tokens=30, temperature=0, speculative="lookup", exact=True)
    s = g.speculative
    assert s.speedup_at_acceptance is not None and s.speedup_at_acceptance > 0
    assert g.to_dict()["speculative"]["exact"] is True


# ---- the token agreement, from scripted outputs ---------------------------------------------------------


def test_token_agreement_counts_positions():
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 4)
    assert token_agreement([1, 2, 9, 4], [1, 2, 3, 4]) == (3, 4)
    assert token_agreement([1, 2], [1, 2, 3]) == (2, 3)  # a missing position disagrees
    assert token_agreement([5, 1, 2, 3], [1, 2, 3, 4]) == (0, 4)  # positions, not a shifted match
    assert token_agreement([], []) == (0, 0)


class _ScriptedEngine:
    """stream() returns a finished stream of scripted ids: `plain` without speculative, `spec` with it."""

    def __init__(self, plain: list[int], spec: list[int]):
        self.plain, self.spec, self.calls = plain, spec, []

    def stream(self, ids, *, max_tokens, speculative=None, **kw):
        self.calls.append({"speculative": speculative, **kw})
        out = self.spec if speculative else self.plain
        step_ns = 5_000_000 if speculative else 10_000_000
        marks = [1_000_000 + i * step_ns for i in range(len(out))]
        stats = None
        if speculative:
            stats = SpecStats("lookup", 16, 16, 8, 6, 3, 1, 2, 1.5, kw.get("exact", True), 1.4)
        g = Generation(
            "x",
            tuple(out),
            "length",
            len(ids),
            0,
            timings_from_marks(0, 0, 0, 1_000_000, marks, len(ids)),
            speculative=stats,
        )
        return SimpleNamespace(generation=g)


class _Rss:
    def reset(self):
        pass

    def read_bytes(self):
        return 0


def _ctx(engine, repeat=0):
    return RequestContext(engine, "fake", repeat, {}, None, _Rss())


@pytest.fixture
def scripted_request(monkeypatch):
    """bench.scenarios.request without a real stream: the scripted generation is the outcome."""
    from ondevice.bench import scenarios as sc

    def request(ctx, ids, max_tokens, seed, *, reuse_prefix, **kw):
        out = sc._Outcome()
        out.generation = ctx.engine.stream(ids, max_tokens=max_tokens, reuse_prefix=reuse_prefix, **kw).generation
        return out

    monkeypatch.setattr(sc, "request", request)


@pytest.mark.parametrize("exact", [None, True, False])
def test_speculative_run_reports_agreement_with_its_plain_run(scripted_request, exact):
    eng = _ScriptedEngine(plain=[1, 2, 3, 4, 5, 6, 7, 8], spec=[1, 2, 3, 9, 9, 6, 7, 8])
    rec = speculative_run(_ctx(eng), "short", [1] * 10, 8, 0, exact=exact)
    s = rec.speculative
    assert (s["agree_tokens"], s["compared_tokens"]) == (6, 8) and s["agreement"] == pytest.approx(0.75)
    spec_call = next(c for c in eng.calls if c["speculative"])
    assert spec_call.get("exact") == exact  # passed through only when given
    assert "exact" not in next(c for c in eng.calls if not c["speculative"])


def test_spec_summary_pools_agreement_over_pairs(scripted_request):
    runs = [
        speculative_run(_ctx(_ScriptedEngine([1, 2, 3, 4], [1, 2, 3, 4]), r), "short", [1] * 4, 4, 0) for r in (0, 1)
    ]
    runs.append(speculative_run(_ctx(_ScriptedEngine([1, 2, 3, 4, 5, 6], [1, 0, 0, 0, 0, 0]), 2), "s", [1], 6, 0))
    summary = spec_summary(runs)
    assert summary["agreement"] == pytest.approx((4 + 4 + 1) / (4 + 4 + 6))  # pooled, not a mean of shares
    assert summary["exact"] is True and summary["speedup_at_acceptance_p50"] == pytest.approx(1.4)
    row = spec_rows([SimpleNamespace(scenario=SPECULATIVE, speculative=summary, model="m", workload="w")])[0]
    header = list(bench_spec.SPEC_HEADERS)
    assert row[header.index("agree")] == "64%" and row[header.index("exact")] == "yes"
    assert row[header.index("pred (k,a)")] == "1.40x"


def test_agreement_just_under_one_is_not_shown_as_100_percent():
    summary = {"pairs": 1, "exact": False, "agreement": 0.997, "acceptance": 0.5}
    summary.update(dict.fromkeys(("mean_accepted_per_step", "drafts_per_step", "plain_decode_tok_s"), None))
    summary.update(dict.fromkeys(("spec_decode_tok_s", "speedup_p50", "predicted_speedup_p50", "itl_p50_s"), None))
    summary.update(k_cap=16, itl_p95_s=None)
    row = spec_rows([SimpleNamespace(scenario=SPECULATIVE, speculative=summary, model="m", workload="w")])[0]
    assert row[list(bench_spec.SPEC_HEADERS).index("agree")] == "99.7%"
