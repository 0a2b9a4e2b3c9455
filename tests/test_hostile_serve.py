"""Hostile numbers on the bench command line: infinite or NaN values are one line and exit 2,
before any model is loaded or any server is contacted."""

from __future__ import annotations

import pytest

from ondevice.cli.main import main


@pytest.mark.parametrize(
    "flags",
    [
        ["--timeout", "inf"],
        ["--timeout", "1e300"],
        ["--timeout", "nan"],
        ["--temperature", "nan"],
        ["--temperature", "inf"],
        ["--url", "http://127.0.0.1:9", "--timeout", "inf"],
        ["--url", "http://127.0.0.1:9", "--timeout", "1e300"],
        ["--url", "http://127.0.0.1:9", "--temperature", "nan"],
    ],
)
def test_bench_refuses_non_finite_numbers(tmp_path, capsys, flags):
    args = ["bench", str(tmp_path / "absent.gguf"), *flags] if "--url" not in flags else ["bench", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("--timeout" in err or "--temperature" in err), err
