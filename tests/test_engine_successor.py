"""The engine on a model whose greedy output is known token by token (tests/_engine_models.py).

Stop conditions (EOS, stop strings across tokens, max_tokens), UTF-8 characters split
over tokens, and the first token going through every check.
"""

from __future__ import annotations

import pytest

from tests._engine_models import BOS, EOS, byte_ids, chain_text, successor_engine, token_id

SP = "\u2581"


@pytest.fixture(scope="module")
def chains():
    the, hello, world, you = token_id(SP + "the"), token_id(SP + "hello"), token_id(SP + "world"), token_id(SP + "you")
    of, city = token_id(SP + "of"), token_id(SP + "city")
    return {
        # " the" -> 中 (3 byte tokens) "a" é (2 byte tokens) EOS
        "utf8": [the] + byte_ids("\u4e2d") + [token_id("a")] + byte_ids("\u00e9") + [EOS],
        # " of" -> " hello world! you" EOS
        "words": [of, hello, world, token_id("!"), you, EOS],
        # " city" -> EOS at once
        "eos_first": [city, EOS],
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory, chains):
    yield from successor_engine(tmp_path_factory.mktemp("succ"), list(chains.values()))


def run(engine, first, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 32)
    stream = engine.stream([BOS, first], **kw)
    events = list(stream)
    return events, stream.generation


def test_greedy_follows_the_chain(engine, chains):
    events, g = run(engine, chains["words"][0])
    assert list(g.token_ids) == chains["words"][1:]
    assert g.text == " hello world! you" == chain_text(chains["words"][1:]).decode()
    assert g.finish_reason == "stop"


def test_character_split_over_tokens_comes_out_whole(engine, chains):
    events, g = run(engine, chains["utf8"][0])
    assert [e.text for e in events] == ["", "", "\u4e2d", "a", "", "\u00e9", ""]
    assert g.text == "\u4e2da\u00e9" == "".join(e.text for e in events)
    assert g.finish_reason == "stop" and g.token_ids[-1] == EOS


def test_stop_string_across_tokens(engine, chains):
    events, g = run(engine, chains["words"][0], stop=["lo wor"])
    assert g.text == " hel" == "".join(e.text for e in events)
    assert g.finish_reason == "stop"
    # the token that completed the stop string is counted (one decode step each)
    assert list(g.token_ids) == chains["words"][1:3]
    assert g.timings.output_tokens == 2 and len(g.timings.itl_s) == 1


def test_partial_stop_at_the_end_is_released(engine, chains):
    events, g = run(engine, chains["words"][0], stop=["you!"])
    assert g.text == " hello world! you" == "".join(e.text for e in events)
    assert events[-2].text == " "  # "you" held back while it could still become "you!"
    assert events[-1].text == "you"  # released with the EOS token
    assert g.finish_reason == "stop"


def test_first_token_eos_stops_at_once(engine, chains):
    events, g = run(engine, chains["eos_first"][0])
    assert g.token_ids == (EOS,) and g.text == "" and g.finish_reason == "stop"
    assert len(events) == 1 and events[0].index == 0
    assert g.timings.itl_s == () and g.timings.tpot_s is None


def test_ignore_eos_keeps_going(engine, chains):
    events, g = run(engine, chains["eos_first"][0], ignore_eos=True, max_tokens=4)
    assert g.token_ids[0] == EOS and len(g.token_ids) == 4
    assert g.finish_reason == "length"


def test_max_tokens_one(engine, chains):
    events, g = run(engine, chains["words"][0], max_tokens=1)
    assert len(events) == 1 and g.finish_reason == "length" and g.text == " hello"
    assert g.timings.output_tokens == 1 and g.timings.ttft_s == pytest.approx(g.timings.e2e_s)


def test_max_tokens_cuts_inside_a_character(engine, chains):
    events, g = run(engine, chains["utf8"][0], max_tokens=2)
    assert g.finish_reason == "length"
    assert g.text == "\ufffd" == "".join(e.text for e in events)  # the incomplete character is flushed, replaced


def test_max_tokens_zero_is_prefill_only(engine, chains):
    events, g = run(engine, chains["words"][0], max_tokens=0)
    assert events == [] and g.token_ids == () and g.finish_reason == "length"
    assert g.timings.prompt_tokens_computed + g.cached_prompt_tokens == 2


def test_stop_with_max_tokens_hitting_same_token(engine, chains):
    events, g = run(engine, chains["words"][0], stop=["lo wor"], max_tokens=2)
    assert g.finish_reason == "stop" and g.text == " hel"


def test_text_prompt_tokenized_with_bos(engine, chains):
    g = engine.generate("of", max_tokens=8, temperature=0)
    assert engine.tokenize("of")[0] == BOS
    assert g.prompt_tokens == len(engine.tokenize("of"))


def test_sampling_at_temperature_follows_a_dominant_token(engine, chains):
    # the successor's logit is 80 above every other: any seed draws it
    events, g = run(engine, chains["words"][0], temperature=0.8, seed=123, repeat_penalty=1.1)
    assert list(g.token_ids) == chains["words"][1:]
