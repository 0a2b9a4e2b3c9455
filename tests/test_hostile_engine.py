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
    [lambda e: e.tokenize("hello there " * 20), lambda e: e.detokenize(byte_ids("hello there " * 20))],
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
