"""ondevice.fmt: one formatter per kind of figure, each caller's style by parameters."""

from __future__ import annotations

import math

import pytest

from ondevice.fmt import binary_bytes, human_bytes, millis, number, rate


def test_millis_default_is_one_decimal_with_unit_and_a_dash_when_missing():
    assert millis(0.0123) == "12.3 ms" and millis(12.0) == "12000.0 ms"
    assert millis(None) == "-" and millis(math.nan) == "-" and millis(math.inf) == "-"


def test_millis_places_by_size_and_seconds_past_the_last_step():
    chat = ((100, 1), (10_000, 0))
    assert [millis(s, places=chat) for s in (0.0123, 0.5, 12.0)] == ["12.3 ms", "500 ms", "12.0 s"]
    table = ((10, 2), (1000, 1), (math.inf, 0))
    assert [millis(s, places=table, unit=False) for s in (0.00123, 0.0123, 1.5, -0.05)] == ["1.23", "12.3", "1500", "-50.00"]
    assert millis(None, missing="–") == "–"


def test_rate_and_zero_as_missing():
    assert rate(42.04) == "42.0 tok/s" and rate(1234.0) == "1234.0 tok/s" and rate(0.0) == "0.0 tok/s"
    assert rate(1234.0, places=((1000, 1), (math.inf, 0))) == "1234 tok/s"
    assert rate(0.0, zero_is_missing=True, missing="–") == "–" and rate(None) == "-"


@pytest.mark.parametrize("v, spec, out", [(1.25, ".1f", "1.2"), (3, ".0f", "3"), (0.000123, ".3g", "0.000123"),
                                          (None, ".1f", "-"), (math.nan, ".2f", "-"), (-math.inf, ".2f", "-")])
def test_number(v, spec, out):
    assert number(v, spec) == out


def test_decimal_and_binary_bytes():
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 kB" and human_bytes(4.9e9) == "4.9 GB"
    assert human_bytes(3e15) == "3000.0 TB" and human_bytes(None) == "unknown"
    assert binary_bytes(512) == "512 B" and binary_bytes(3 << 20) == "3.0 MiB" and binary_bytes(5 << 40) == "5120.0 GiB"
    assert binary_bytes(None) == "unknown" and binary_bytes(None, missing="–") == "–"
