"""bench --url end to end against a real llama-cpp-python server (its `server` extra) on 127.0.0.1
serving the default model, started through our launcher so it places weights as the crash
guard says. Bounded: a few requests of 8 tokens, every request and the start under a timeout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.default_model
pytest.importorskip(
    "llama_cpp.server", reason="llama-cpp-python's server extra is not installed (pip install -e '.[test]')"
)

START_S = 180  # model load on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "wb") as out:
        # One thread: on a busy shared machine llama.cpp's threads wait for each other at every op.
        # interrupt_requests False: concurrent requests queue instead of cutting each other off.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ondevice.llama.server",
                "--model",
                str(default_model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "512",
                "--n_threads",
                "1",
                "--n_threads_batch",
                "1",
                "--interrupt_requests",
                "False",
                "--verbose",
                "False",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                urllib.request.urlopen(url + "/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not start (exit {proc.poll()}):\n{log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _bench(tmp_path, name, *argv):
    from ondevice.cli.main import main

    out = tmp_path / f"{name}.json"
    rc = main(["bench", *argv, "--no-progress", "--timeout", "120", "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_launcher_applies_the_crash_guard(server):
    from ondevice.llama.guard import cpu_buffer_verdict

    _, log = server
    assert f"CPU buffer types {cpu_buffer_verdict().mode} (crash guard)" in log.read_text()


def test_levels_against_llama_cpp_server(server, default_model, tmp_path):
    url, _ = server
    rc, doc = _bench(
        tmp_path,
        "levels",
        "--url",
        url,
        "--tokenizer",
        str(default_model),
        "-p",
        "32",
        "-n",
        "8",
        "--concurrency",
        "1,2",
        "--rate",
        "2",
        "--requests",
        "3",
        "--warmup",
        "1",
    )
    assert rc == 0, [f for r in doc["results"] for f in r["failures"]]
    assert [r["scenario"] for r in doc["results"]] == ["closed_c1", "closed_c2", "open_r2"]
    assert doc["record"]["target"]["tokenizer"] == default_model.name
    for r in doc["results"]:
        assert r["ok_runs"] == 3 and r["load"]["sent"] == 3 and r["load"]["little_lw"] > 0
        for run in r["runs"]:
            s = run["serve"]
            assert run["finish_reason"] == "length" and s["token_count"] == "tokenizer" and s["chunks"] >= 6
            assert abs(run["output_tokens"] - 8) <= 2  # the streamed text re-tokenized
            assert sum(run["itl_s"]) == pytest.approx(run["e2e_s"] - run["ttft_s"], abs=1e-6)
            assert 0 < run["ttft_s"] <= run["e2e_s"] <= s["done_s"] - s["sent_s"] + 1e-6


def test_local_and_server_interleaved_then_compared(server, default_model, tmp_path, capsys):
    from ondevice.cli.main import main

    url, _ = server
    rc, doc = _bench(
        tmp_path,
        "vs",
        "--url",
        url,
        "--local",
        str(default_model),
        "-t",
        "1",
        "-p",
        "32",
        "-n",
        "8",
        "--requests",
        "3",
        "--warmup",
        "1",
    )
    assert rc == 0
    by = {r["model"]: r for r in doc["results"]}
    local, remote = by[default_model.name], next(r for m, r in by.items() if m != default_model.name)
    assert local["scenario"] == "resident" and remote["scenario"] == "closed_c1"
    assert local["ok_runs"] == remote["ok_runs"] == 3
    capsys.readouterr()
    assert main(["bench", "compare", str(tmp_path / "vs.json")]) == 0
    out = capsys.readouterr().out
    assert "resident" in out and "ttft_s" in out and "decode_tok_s" in out
