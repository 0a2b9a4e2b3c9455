"""TextAssembler: UTF-8 hold-back and stop strings across token boundaries (pure Python)."""

from __future__ import annotations

import pytest

from ondevice.engine.text import TextAssembler


def feed(pieces, stop=()):
    t = TextAssembler(stop)
    out = [t.push(p) for p in pieces]
    return t, out


def test_split_multibyte_character_comes_out_whole():
    t, out = feed([b"a", b"\xe4", b"\xb8", b"\xad", b"b"])
    assert out == ["a", "", "", "\u4e2d", "b"]
    assert t.flush() == ""


def test_four_byte_character_split_in_every_way():
    emoji = "\U0001f600".encode()
    for cut in range(1, 4):
        t, out = feed([emoji[:cut], emoji[cut:]])
        assert out == ["", "\U0001f600"]


def test_incomplete_character_at_end_becomes_replacement_on_flush():
    t, out = feed([b"x", b"\xe4\xb8"])
    assert out == ["x", ""]
    assert t.flush() == "\ufffd"


def test_invalid_byte_is_replaced_not_held():
    t, out = feed([b"\xff", b"ok"])
    assert out == ["\ufffd", "ok"]


def test_stop_string_across_tokens_is_never_emitted():
    t, out = feed([b" hello", b" world", b"!"], stop=("lo wor",))
    assert out == [" hel", "", ""]
    assert t.stopped and t.stop_string == "lo wor"
    assert t.flush() == ""


def test_stop_string_inside_one_token():
    t, out = feed([b"abc\nUser: x"], stop=("\nUser:",))
    assert out == ["abc"]
    assert t.stopped


def test_partial_stop_is_released_when_it_does_not_complete():
    t, out = feed([b"Paris", b"\nU", b"s", b"a"], stop=("\nUser:",))
    assert out == ["Paris", "", "", "\nUsa"]
    assert not t.stopped


def test_partial_stop_at_end_is_flushed():
    t, out = feed([b"Paris", b"\nUse"], stop=("\nUser:",))
    assert out == ["Paris", ""]
    assert t.held == "\nUse"
    assert t.flush() == "\nUse"


def test_earliest_of_several_stops_wins():
    t, out = feed([b"one two three"], stop=("three", "two"))
    assert out == ["one "]
    assert t.stop_string == "two"


def test_stop_made_of_a_split_character():
    t, out = feed([b"x\xe4", b"\xb8", b"\xadyz"], stop=("\u4e2dy",))
    assert out == ["x", "", ""]
    assert t.stopped


def test_no_stop_strings_releases_everything_at_once():
    t, out = feed([b"a", b"b"])
    assert out == ["a", "b"] and t.held == ""


@pytest.mark.parametrize(
    "pieces",
    [
        [b"ab", b"c\xe2\x82", b"\xac d", b"\nUs", b"er: z"],
        [b"\nUser:"],
        [b"\n", b"U", b"ser:"],
        [b"no stop", b" in \xc3", b"\xa9 here"],
    ],
)
def test_concatenation_equals_whole_decode_up_to_stop(pieces):
    t, out = feed(pieces, stop=("\nUser:",))
    whole = b"".join(pieces).decode("utf-8", "replace")
    text = "".join(out) + t.flush()
    expected = whole[: whole.find("\nUser:")] if "\nUser:" in whole else whole
    assert text == expected


def test_nothing_after_stop():
    t, out = feed([b"a\nUser:", b"more"], stop=("\nUser:",))
    assert out == ["a", ""]
    assert t.flush() == ""
