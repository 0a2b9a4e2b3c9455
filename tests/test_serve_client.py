"""bench --url against a small in-test SSE server on 127.0.0.1: the odd streams, the bad input,
and the command end to end (reports, exit codes, the API key kept out of everything)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from ondevice.bench.serve.client import Target, stream_request
from ondevice.bench.serve.measure import RequestSpec, to_record
from ondevice.cli.main import main
from ondevice.core.reasoning import DEFAULT_MARKERS
from tests.serve_fakes import STALL_S, FakeServer


@pytest.fixture(scope="module")
def fake():
    with FakeServer() as s:
        yield s


def _req(url: str, *, chat: bool = False, timeout: float = 10.0, key: str | None = None, n: int = 4):
    t = Target(url, model="m", chat=chat, timeout_s=timeout, api_key=key)
    body = {"max_tokens": n, **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    return stream_request(t, body)


def test_several_tokens_per_chunk_usage_at_the_end(fake):
    lg = _req(fake.url("multi"))
    assert lg.status == "ok" and lg.done and lg.finish_reason == "length" and lg.http_status == 200
    assert [c.text for c in lg.chunks] == [" a b", " c d e", " f"]  # the role-only chunk carries no text
    assert lg.usage == {"prompt_tokens": 7, "completion_tokens": 6}
    assert all(b.t_ns > a.t_ns for a, b in zip(lg.chunks, lg.chunks[1:])) and lg.chunks[0].t_ns > lg.start_ns
    r = to_record(
        lg,
        RequestSpec("m", "closed_c1", "w", 0, 7, 6, 0),
        counter=None,
        markers=DEFAULT_MARKERS,
        level_start_ns=lg.start_ns,
    )
    t = r.timings
    assert r.ok and t.output_tokens == 6 and len(t.itl_s) == 5 and r.prompt_tokens == 7
    assert t.ttft_s <= t.e2e_s <= r.serve["done_s"] and sum(t.itl_s) == pytest.approx(t.e2e_s - t.ttft_s, abs=1e-6)
    assert t.ttft_s >= 0.01  # the server waits GAP_S before its first chunk


def test_reasoning_deltas_and_inline_think(fake):
    lg = _req(fake.url("reasoning"), chat=True)
    assert lg.status == "ok" and [c.reasoning for c in lg.chunks[:2]] == ["Let me", " think."]
    r = to_record(
        lg, RequestSpec("m", "closed_c1", "w", 0, 1, 5, 0), counter=None, markers=DEFAULT_MARKERS, level_start_ns=0
    )
    visible = (lg.chunks[3].t_ns - lg.start_ns) / 1e9
    assert r.timings.ttft_visible_s == pytest.approx(visible) and r.timings.ttft_visible_s > r.timings.ttft_s
    lg = _req(fake.url("think"))
    r = to_record(
        lg, RequestSpec("m", "closed_c1", "w", 0, 1, 5, 0), counter=None, markers=DEFAULT_MARKERS, level_start_ns=0
    )
    assert r.timings.ttft_visible_s == pytest.approx((lg.chunks[3].t_ns - lg.start_ns) / 1e9)


def test_server_timings_kept(fake):
    lg = _req(fake.url("timings"))
    assert lg.server_timings["output_tokens"] == 3 and lg.server_timings["prompt_s"] == pytest.approx(0.02)


@pytest.mark.parametrize(
    "case, status, words",
    [
        ("error_mid", "failed", "the model crashed"),
        ("malformed", "failed", "malformed"),
        ("http500", "failed", "HTTP 500"),
        ("notsse", "failed", "not an SSE stream"),
        ("cut", "failed", "without a finish_reason"),
    ],
)
def test_bad_streams_are_failures_with_reasons(fake, case, status, words):
    lg = _req(fake.url(case))
    assert lg.status == status and words in lg.reason


def test_stalled_stream_times_out(fake):
    t0 = time.monotonic()
    lg = _req(fake.url("stall"), timeout=0.5)
    assert lg.status == "timeout" and "timeout after 0.5 s" in lg.reason and len(lg.chunks) == 1
    assert time.monotonic() - t0 < STALL_S - 1


def test_refused_connection_and_key_scrubbed(fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    lg = _req(f"http://127.0.0.1:{port}/v1", timeout=2)
    assert lg.status == "failed" and "refused" in lg.reason
    lg = _req(fake.url("auth"), key="sk-test-123")
    assert lg.status == "failed" and "HTTP 401" in lg.reason and "sk-test-123" not in lg.reason and "***" in lg.reason
    assert fake.bodies[-1][2].get("Authorization") == "Bearer sk-test-123"


def _bench(tmp_path, *extra, name="r"):
    out = tmp_path / f"{name}.json"
    rc = main(
        [
            "bench",
            *extra,
            "--no-progress",
            "--json",
            str(out),
            "--csv",
            str(tmp_path / f"{name}.csv"),
            "--md",
            str(tmp_path / f"{name}.md"),
        ]
    )
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_cli_levels_end_to_end(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_KEY", "sk-never-written")
    rc, doc = _bench(
        tmp_path,
        "--url",
        fake.url("one"),
        "--api-key-env",
        "FAKE_KEY",
        "-p",
        "16",
        "-n",
        "5",
        "--concurrency",
        "1,2",
        "--rate",
        "20",
        "--requests",
        "4",
        "--warmup",
        "0",
        "--slo",
        "ttft_p95=5,tpot_p95=5",
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert [r["scenario"] for r in doc["results"]] == ["closed_c1", "closed_c2", "open_r20"]
    for r in doc["results"]:
        port = int(fake.url("one").split(":")[2].split("/")[0])
        assert r["ok_runs"] == 4 and r["model"] == f"fake-one.gguf @ 127.0.0.1:{port}"
        assert r["load"]["sent"] == 4 and r["load"]["mean_in_flight"] > 0 and r["load"]["little_lw"] > 0
        assert r["slo"]["good"] == 4 and r["load"]["goodput_rps"] > 0
        assert r["itl_chunk_s"]["n"] == 16 and r["ttft_visible_s"]["n"] == 4
        for run in r["runs"]:
            assert run["serve"]["token_count"] == "estimated (1 token per chunk)" and run["output_tokens"] == 5
    assert doc["results"][1]["load"]["mean_in_flight"] > doc["results"][0]["load"]["mean_in_flight"]
    rec = doc["record"]
    assert rec["target"]["api_key_env"] == "FAKE_KEY" and rec["target"]["model"] == "/models/fake-one.gguf"
    assert rec["settings"]["load"]["requests_per_level"] == 4
    sent = [b for c, b, _ in fake.bodies if c == "one"][-1]
    assert sent["max_tokens"] == 5 and sent["min_tokens"] == 5 and sent["ignore_eos"] and sent["stream"]
    assert sent["stream_options"] == {"include_usage": True} and sent["model"] == "/models/fake-one.gguf"
    for f in ("r.json", "r.csv", "r.md"):
        assert "sk-never-written" not in (tmp_path / f).read_text()
    assert "sk-never-written" not in out and "load levels" in out
    md = (tmp_path / "r.md").read_text()
    assert "## Load levels" in md and "- server: http://127.0.0.1:" in md and "- engine:" not in md
    assert "load_mean_in_flight" in (tmp_path / "r.csv").read_text().splitlines()[0]


def test_cli_failures_are_kept_and_exit_1(fake, tmp_path):
    rc, doc = _bench(
        tmp_path,
        "--url",
        fake.url("error_mid"),
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--warmup",
        "0",
        "-p",
        "8",
        "-n",
        "4",
    )
    assert rc == 1
    r = doc["results"][0]
    assert r["ok_runs"] == 0 and len(r["failures"]) == 2 and "the model crashed" in r["failures"][0]["reason"]


def test_cli_unreachable_server_never_hangs(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    rc, doc = _bench(
        tmp_path, "--url", f"http://127.0.0.1:{port}/v1", "--requests", "2", "--warmup", "1", "-p", "8", "-n", "2"
    )
    assert rc == 1 and time.monotonic() - t0 < 30
    assert all(f["status"] == "failed" for f in doc["results"][0]["failures"])
    assert "GET /models failed" in doc["record"]["target"]["notes"][0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--url", "http://127.0.0.1:1/v1", "--concurrency", "0"], "--concurrency 0: must be greater than 0"),
        (["--url", "http://127.0.0.1:1/v1", "--rate", "-1"], "--rate -1: must be greater than 0"),
        (["--url", "http://127.0.0.1:1/v1", "--rate", "x"], "expected comma-separated numbers"),
        (["--url", "localhost:8000"], "expected http://HOST:PORT/v1"),
        (["--concurrency", "2"], "--concurrency applies to server benchmarks"),
        (["--url", "http://127.0.0.1:1/v1", "some.gguf"], "name the served model with --model"),
        (["--url", "http://127.0.0.1:1/v1", "--no-kv-cache"], "--no-kv-cache applies to local benchmarks"),
        (["--url", "http://127.0.0.1:1/v1", "--api-key-env", "ONDEVICE_NO_SUCH_VAR"], "is not set"),
        (["--url", "http://127.0.0.1:1/v1", "--requests", "0"], "--requests 0: must be greater than 0"),
        (["--url", "http://127.0.0.1:1/v1", "--local", "x.gguf", "--concurrency", "2"], "include 1 in --concurrency"),
    ],
)
def test_cli_bad_flags_one_line_exit_2(argv, words, capsys):
    assert main(["bench", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
