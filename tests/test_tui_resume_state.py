"""A saved conversation keeps its KV state beside its history; reopening restores it when predicted faster."""

from __future__ import annotations

import threading

import pytest
from ondevice.tui import session as session_mod
from ondevice.tui.session import ChatSession, ChatSettings
from ondevice.tui.store import HistoryStore

from tests.tui_pilot import tiny_engine

GREEDY = ChatSettings(system="You are a test.", temperature=0.0, top_p=1.0, max_tokens=8)


@pytest.fixture
def engine(tiny_model):
    eng = tiny_engine(tiny_model)
    yield eng
    eng.close()


def one_turn(engine, store) -> int:
    s = ChatSession(engine, GREEDY, store, extra_sampling={"ignore_eos": True})
    s.run_turn("hello world", threading.Event(), lambda ev: None)
    assert s.state_path().is_file()  # kept beside the history after the turn
    return s.conversation_id


@pytest.mark.parametrize(("disk_gbs", "restored"), [(1000.0, True), (1e-9, False)])
def test_reopening_restores_or_recomputes_as_predicted(engine, tmp_path, monkeypatch, disk_gbs, restored):
    store = HistoryStore(tmp_path / "h.sqlite3")
    cid = one_turn(engine, store)
    held = engine.kv_cache_tokens
    engine.reset()
    monkeypatch.setattr(session_mod, "_disk_read_gbs", lambda: disk_gbs)
    s = ChatSession(engine, GREEDY, store, extra_sampling={"ignore_eos": True})
    s.restore(store.load(cid))
    assert ("restoring" if restored else "recomputing") in s.resume_note and "restore predicted" in s.resume_note
    assert engine.kv_cache_tokens == (held if restored else 0)
    turn = s.run_turn("again", threading.Event(), lambda ev: None)
    assert (turn.generation.cached_prompt_tokens > 0) is restored
