"""Hostile use of an Engine: calls into llama.cpp racing close() meet a typed error, never a crash."""

from __future__ import annotations

import threading

import pytest

from ondevice.core.errors import EngineError
from tests._engine_models import build_successor_model, byte_ids


def _hammer(engine, call, started: threading.Event, stop: threading.Event, outcomes: list) -> None:
    """Call `call(engine)` until the engine refuses; record what ended the loop."""
    try:
        while not stop.is_set():
            call(engine)
            started.set()
    except EngineError as exc:  # EngineBusyError is an EngineError too
        outcomes.append(type(exc).__name__)
    except BaseException as exc:  # anything else is the defect
        outcomes.append(f"unexpected {type(exc).__name__}: {exc}")
    finally:
        started.set()


@pytest.mark.parametrize(
    "call",
    [lambda e: e.tokenize("hello there " * 20000), lambda e: e.detokenize(byte_ids("hello there " * 20000))],
    ids=["tokenize", "detokenize"],
)
def test_close_while_tokenizing_gives_typed_errors(tmp_path, call):
    from ondevice.engine import load

    engine = load(build_successor_model(tmp_path / "succ.gguf", [byte_ids("hi")]), n_ctx=256, n_threads=1)
    started, stop, outcomes = threading.Event(), threading.Event(), []
    workers = [threading.Thread(target=_hammer, args=(engine, call, started, stop, outcomes)) for _ in range(4)]
    for w in workers:
        w.start()
    assert started.wait(60)
    engine.close()
    for w in workers:
        w.join(60)
    stop.set()
    assert len(outcomes) == 4 and all(o == "EngineError" for o in outcomes), outcomes


# ---- the crash guard's self-test: killed from outside, or hanging ------------------------------
@pytest.fixture
def guard_cache(monkeypatch, tmp_path):
    """The crash guard with its verdict in tmp_path and no memo from earlier tests."""
    from ondevice.llama import guard

    monkeypatch.setattr(guard, "_memo", {})
    monkeypatch.delenv(guard.ENV_VAR, raising=False)
    monkeypatch.setattr(guard.paths, "cache_dir", lambda: tmp_path)
    return guard


def test_a_self_test_killed_by_sigkill_is_inconclusive_not_a_crash(guard_cache):
    import os
    import signal
    import sys

    kill_self = [sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGKILL)})"]
    outcome = guard_cache.run_check("all", guard_cache.paths.cache_dir(), argv=kill_self)
    assert not outcome.ok and not outcome.crashed and "SIGKILL" in outcome.detail
    verdict = guard_cache.cpu_buffer_verdict(check=lambda mode, work: outcome, available=["CPU_REPACK"])
    assert verdict.source == "fallback" and not os.path.exists(guard_cache.verdict_path())


def test_a_hanging_self_test_is_stored_once_with_a_short_timeout(guard_cache):
    import sys

    assert guard_cache.CHECK_TIMEOUT_S <= 30
    hang = guard_cache.run_check(
        "all",
        guard_cache.paths.cache_dir(),
        argv=[sys.executable, "-c", "import threading; threading.Event().wait()"],
        timeout_s=0.5,
    )
    assert hang.hung and not hang.crashed
    asked = []

    def check(mode, work):
        asked.append(mode)
        return hang

    first = guard_cache.cpu_buffer_verdict(check=check, available=["CPU_REPACK"])
    guard_cache._memo.clear()  # a later command: a new process reads the stored verdict
    again = guard_cache.cpu_buffer_verdict(check=check, available=["CPU_REPACK"])
    assert first.mode == again.mode == "none" and again.source == "cache" and asked == ["all"]


@pytest.mark.parametrize("command", ["info"])
def test_a_model_name_too_long_is_one_line_exit_2(tmp_path, capsys, command):
    from ondevice.cli.main import main

    too_long = str(tmp_path / ("m" * 300 + ".gguf"))
    argv = [command, too_long] + (["hi"] if command == "run" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ondevice: error:"), err
