"""ondevice.core.fmt: one formatter per kind of figure, each caller's style by parameters."""

from __future__ import annotations

import math

import pytest

from ondevice.core.fmt import binary_bytes, human_bytes, millis, number, rate, table


def test_millis_default_is_one_decimal_with_unit_and_a_dash_when_missing():
    assert millis(0.0123) == "12.3 ms" and millis(12.0) == "12000.0 ms"
    assert millis(None) == "-" and millis(math.nan) == "-" and millis(math.inf) == "-"


def test_millis_places_by_size_and_seconds_past_the_last_step():
    chat = ((100, 1), (10_000, 0))
    assert [millis(s, places=chat) for s in (0.0123, 0.5, 12.0)] == ["12.3 ms", "500 ms", "12.0 s"]
    table = ((10, 2), (1000, 1), (math.inf, 0))
    assert [millis(s, places=table, unit=False) for s in (0.00123, 0.0123, 1.5, -0.05)] == [
        "1.23",
        "12.3",
        "1500",
        "-50.00",
    ]
    assert millis(None, missing="–") == "–"


def test_rate_and_zero_as_missing():
    assert rate(42.04) == "42.0 tok/s" and rate(1234.0) == "1234.0 tok/s" and rate(0.0) == "0.0 tok/s"
    assert rate(1234.0, places=((1000, 1), (math.inf, 0))) == "1234 tok/s"
    assert rate(0.0, zero_is_missing=True, missing="–") == "–" and rate(None) == "-"


@pytest.mark.parametrize(
    "v, spec, out",
    [
        (1.25, ".1f", "1.2"),
        (3, ".0f", "3"),
        (0.000123, ".3g", "0.000123"),
        (None, ".1f", "-"),
        (math.nan, ".2f", "-"),
        (-math.inf, ".2f", "-"),
    ],
)
def test_number(v, spec, out):
    assert number(v, spec) == out


def test_decimal_and_binary_bytes():
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 kB" and human_bytes(4.9e9) == "4.9 GB"
    assert human_bytes(3e15) == "3000.0 TB" and human_bytes(None) == "unknown"
    assert binary_bytes(512) == "512 B" and binary_bytes(3 << 20) == "3.0 MiB" and binary_bytes(5 << 40) == "5120.0 GiB"
    assert binary_bytes(None) == "unknown" and binary_bytes(None, missing="–") == "–"


HEADERS = ["name", "size", "state", "notes"]
ROWS = [
    ["alpha", "1.5 GB", "no significant difference", "the first note runs on for a while, " * 3],
    ["b", "12.0 MB", "faster", "short"],
]


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_table_within_its_width_is_the_plain_table():
    plain = table(HEADERS, ROWS, "lrll")
    assert (
        table(HEADERS, ROWS, "lrll", width=200)
        == plain
        == table(HEADERS, ROWS, "lrll", width=max(map(len, _lines(plain))))
    )
    assert len(_lines(plain)) == 2 + len(ROWS) and "---" in _lines(plain)[1]


@pytest.mark.parametrize("width", [80, 60])
def test_table_folds_text_cells_to_fit_and_keeps_every_word(width):
    text = table(HEADERS, ROWS, "lrll", width=width)
    assert max(map(len, _lines(text))) <= width
    assert "left out" not in text and len(_lines(text)) > 2 + len(ROWS)
    assert text.split().count("note") == 3 and "12.0 MB" in text and "1.5 GB" in text  # figures whole


def test_table_leaves_out_the_named_columns_first_and_says_where_the_full_table_is():
    text = table(HEADERS, ROWS, "lrll", width=42, drop=("notes", "size"), whole=("state",), full="--json")
    assert max(map(len, _lines(text))) <= 42
    assert "no significant difference" in text  # a whole column keeps each cell on one line
    assert "the first note" not in text and "1.5 GB" in text  # notes could go and did; size was not needed
    assert " ".join(_lines(text)[-2:]) == "(1 column left out to fit 42: notes; --json has the full table)"
    assert "(2 columns left out to fit 40: size, notes;" in " ".join(
        _lines(table(HEADERS, ROWS, "lrll", width=40, drop=("notes", "size"), whole=("state",), full="--json"))
    )
    narrow = table(HEADERS, ROWS, "lrll", width=30, whole=("state",))
    assert "state" not in _lines(narrow)[0] and "notes" not in narrow.splitlines()[0]  # from the right otherwise
    assert "2 columns left out to fit 30: state, notes" in " ".join(_lines(narrow)[-2:])


def test_table_headers_fold_at_spaces_before_any_cell_folds():
    headers = ["scenario", "TTFT p50/p95 ms", "ITL p50 ms", "notes"]
    rows = [["resident", "311.3/316.4", "3.26", "a short note"]]
    text = table(headers, rows, "lrrl", width=len("resident  311.3/316.4  ITL p50 ms  a short note"))
    assert max(map(len, _lines(text))) <= len("resident  311.3/316.4  ITL p50 ms  a short note")
    assert _lines(text)[0].split() == ["scenario", "TTFT", "ITL", "p50", "ms", "notes"]  # the widest header folded
    assert _lines(text)[1].split() == ["p50/p95", "ms"] and "a short note" in text and "311.3/316.4" in text
