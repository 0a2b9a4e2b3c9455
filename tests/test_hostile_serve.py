"""Hostile numbers on the bench command line: infinite or NaN values are one line and exit 2,
before any model is loaded or any server is contacted."""

from __future__ import annotations

import pytest

from ondevice.cli.main import main
from tests.serve_fakes import BROKEN, broken_server


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


def _endless_server(mode: str):
    """A loopback server that answers and never ends: SSE chunks, SSE comments only, or a JSON body trickled a byte
    at a time; the connection carries no length, so http.client reads until the server closes it."""
    from tests.serve_fakes import broken_server

    def behave(conn, stop):
        if mode == "models":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        piece = {"models": b" ", "ping": b": ping\n\n"}.get(mode, b'data: {"choices":[{"text":"x"}]}\n\n')
        while not stop.wait(0.02):
            conn.sendall(piece)

    return broken_server(behave)


@pytest.mark.parametrize("mode", ["chunks", "ping"])
def test_a_stream_that_never_ends_stops_at_the_timeout(mode):
    import time

    from ondevice.bench.serve.client import Target, stream_request

    listener, stop = _endless_server(mode)
    try:
        target = Target(url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1", timeout_s=0.5)
        started = time.monotonic()
        log = stream_request(target, {"prompt": "x", "max_tokens": 4})
        assert log.status == "timeout", log.reason
        assert "timeout after 0.5 s" in log.reason
        assert time.monotonic() - started < 20  # a hang guard only: the deadline is what ended it
    finally:
        stop.set()
        listener.close()


def test_a_trickled_models_answer_stops_at_the_timeout():
    from ondevice.bench.serve.client import Target, get_json

    listener, stop = _endless_server("models")
    try:
        target = Target(url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1")
        with pytest.raises(TimeoutError):
            get_json(target, "/models", timeout_s=0.5)
    finally:
        stop.set()
        listener.close()


@pytest.mark.hostile_slow
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_server_ends_each_request_by_its_timeout(case):
    import time

    from ondevice.bench.serve.client import Target, get_json, stream_request

    listener, stop = broken_server(BROKEN[case])
    try:
        target = Target(url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1", timeout_s=2.0)
        started = time.monotonic()
        log = stream_request(target, {"prompt": "x", "max_tokens": 4})
        assert log.status in ("timeout", "failed") and log.reason, (log.status, log.reason)
        try:
            get_json(target, "/models", timeout_s=2.0)
        except (OSError, ValueError):
            pass  # TimeoutError is an OSError; a malformed answer is ValueError: both are a labelled failure
        assert time.monotonic() - started < 60  # a hang guard only: the deadlines are what ended them
    finally:
        stop.set()
        listener.close()
