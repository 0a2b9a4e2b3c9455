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


def test_server_error_text_reaches_the_table_without_control_characters():
    import json

    from ondevice.bench.serve.sse import Event, StreamError, parse_chunk

    evil = {"error": {"message": "\x1b[2J\x1b[31mboom\r\x07\nforged line"}}
    with pytest.raises(StreamError) as e:
        parse_chunk(Event(0, "message", json.dumps(evil)))
    assert e.value.kind == "server_error"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in str(e.value)), repr(str(e.value))


@pytest.mark.parametrize("field, raw", [("prompt_n", "1e400"), ("predicted_ms", "-1e400"), ("prompt_n", "-3")])
def test_a_bad_server_number_is_that_requests_labelled_failure(field, raw):
    import json

    from ondevice.bench.serve.sse import Event, StreamError, parse_chunk

    timings = {"predicted_n": 3, "predicted_ms": 10.0, "prompt_n": 5, "prompt_ms": 2.0}
    text = json.dumps(timings).replace(f'"{field}": ', f'"{field}": {raw}, "x": ')  # a literal json cannot write
    data = '{"choices": [], "timings": ' + text + "}"
    with pytest.raises(StreamError) as e:
        parse_chunk(Event(0, "message", data))
    assert e.value.kind == "malformed" and field in str(e.value)
