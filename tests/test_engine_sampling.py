"""Sampling settings take effect: the seed, top-k, top-p, min-p and the repeat penalty, on the tiny
synthetic model (its random weights give a flat distribution over 512 tokens, so a free draw at
temperature 1 almost never picks the most likely token twice in a row)."""

from __future__ import annotations

import pytest

PROMPT = "the people of the world are in the city of paris and"
FREE = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}  # every filter off


def ids(engine, max_tokens=16, **kw):
    return list(engine.generate(PROMPT, max_tokens=max_tokens, ignore_eos=True, **kw).token_ids)


@pytest.fixture(scope="module")
def greedy(engine):
    return ids(engine, temperature=0)


@pytest.mark.parametrize("sampling", [FREE, {"temperature": 0.8}], ids=["filters-off", "defaults"])
def test_seed_decides_the_draw(engine, sampling):
    seven, eight = ids(engine, seed=7, **sampling), ids(engine, seed=8, **sampling)
    assert seven != eight
    assert ids(engine, seed=7, **sampling) == seven and ids(engine, seed=8, **sampling) == eight


def test_free_draws_are_not_greedy(engine, greedy):
    """The baseline the filters below are measured against."""
    assert all(ids(engine, seed=s, **FREE) != greedy for s in (7, 8, 9))


@pytest.mark.parametrize("name, value", [("top_k", 1), ("top_p", 1e-6), ("min_p", 1.0)])
def test_a_filter_keeping_one_token_is_greedy(engine, greedy, name, value):
    """top-k 1, a tiny nucleus, or min-p 1 leave only the most likely token: any seed draws it."""
    assert all(ids(engine, seed=s, **{**FREE, name: value}) == greedy for s in (7, 8, 9))


def test_top_k_bounds_the_choices(engine, greedy):
    first = {ids(engine, max_tokens=1, seed=s, **{**FREE, "top_k": 2})[0] for s in range(24)}
    assert greedy[0] in first and len(first) == 2  # the two most likely, both drawn in 24 tries
    assert len({ids(engine, max_tokens=1, seed=s, **FREE)[0] for s in range(24)}) > 10  # no filter: many


def test_repeat_penalty_breaks_greedy_loops(engine, greedy):
    assert len(set(greedy)) < len(greedy)  # this model's greedy output repeats tokens
    penalised = ids(engine, temperature=0, repeat_penalty=1.5)
    assert penalised != greedy and len(set(penalised)) == len(penalised)  # all 16 within the 64-token window
    assert ids(engine, temperature=0, repeat_penalty=1.0) == greedy  # 1.0 is off
