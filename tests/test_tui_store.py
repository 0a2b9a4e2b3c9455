"""Chat history store: round trips, exports, and a process killed mid-write."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ondevice.tui.store import HistoryError, HistoryStore, to_markdown

from ondevice.core.fmt import stats_footer

STATS = {
    "finish_reason": "stop",
    "prompt_tokens": 12,
    "cached_prompt_tokens": 4,
    "timings": {"ttft_s": 0.125, "decode_tok_s": 42.0, "output_tokens": 7, "itl_s": [0.02, 0.03]},
}


def test_round_trip_and_listing(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    assert store.list_conversations() == []
    cid = store.create_conversation("gemma", system="Be terse.", settings={"temperature": 0.7})
    empty = store.create_conversation("gemma")
    store.add_message(cid, "user", "Hello   there\nfriend")
    store.add_message(cid, "assistant", "Hi!", finish_reason="stop", stats=STATS)
    store.add_message(cid, "note", "Dropped 1 turn")
    conv = store.load(cid)
    assert conv.title == "Hello there friend"
    assert conv.system == "Be terse." and conv.settings == {"temperature": 0.7}
    assert [m.role for m in conv.messages] == ["user", "assistant", "note"]
    assert conv.messages[1].stats == STATS and conv.messages[1].finish_reason == "stop"
    listed = store.list_conversations()
    assert [c.id for c in listed] == [cid]  # the empty one is not listed
    assert listed[0].n_messages == 2
    assert store.last_conversation_id() == cid
    assert store.load(empty).messages == ()
    store.close()
    # reopen: the data and the WAL mode persist
    store = HistoryStore(tmp_path / "h.sqlite3")
    assert store.load(cid).messages[0].content == "Hello   there\nfriend"
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_newest_first_and_long_title(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    a = store.create_conversation("m")
    store.add_message(a, "user", "x" * 200)
    b = store.create_conversation("m")
    store.add_message(b, "user", "second")
    assert [c.id for c in store.list_conversations()] == [b, a]
    title = store.load(a).title
    assert len(title) == 60 and title.endswith("…")
    store.add_message(a, "user", "again")  # a is now the most recent
    assert store.last_conversation_id() == a
    assert store.load(a).title == title  # the title is the first user message


def test_errors(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    with pytest.raises(HistoryError, match="no conversation with id 99"):
        store.add_message(99, "user", "x")
    with pytest.raises(HistoryError, match="no conversation"):
        store.load(99)
    cid = store.create_conversation("m")
    with pytest.raises(HistoryError):
        store.add_message(cid, "robot", "x")  # role CHECK constraint
    assert store.load(cid).messages == ()
    (tmp_path / "notadb.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(HistoryError):
        HistoryStore(tmp_path / "notadb.sqlite3")


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(HistoryError, match="newer"):
        HistoryStore(path)


def test_export_markdown_and_json(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    cid = store.create_conversation("gemma", system="Be terse.")
    store.add_message(cid, "user", "What is 2+2?")
    store.add_message(cid, "assistant", "**4**", finish_reason="cancelled", stats=STATS)
    md_path = store.export(cid, tmp_path / "out" / "c.md")
    md = md_path.read_text()
    assert md.startswith("# What is 2+2?")
    assert "## User\n\nWhat is 2+2?" in md and "## Assistant\n\n**4**" in md
    assert "*TTFT 125 ms · 42.0 tok/s · 7 tok · 4 cached · cancelled*" in md
    assert "system prompt: Be terse." in md
    data = json.loads(store.export(cid, tmp_path / "c.json").read_text())
    assert data["messages"][1]["stats"]["timings"]["itl_s"] == [0.02, 0.03]
    assert data["system"] == "Be terse."
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]
    (tmp_path / "plain").write_text("x")
    with pytest.raises(HistoryError, match="cannot write"):
        store.export(cid, tmp_path / "plain" / "inside-a-file.md")


def test_stats_footer_without_stats():
    assert stats_footer(None, "cancelled") == "cancelled"
    assert stats_footer({}, None) == ""


def test_to_markdown_notes(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    cid = store.create_conversation("m")
    store.add_message(cid, "note", "Context full: dropped the oldest turn.")
    assert "> Context full: dropped the oldest turn." in to_markdown(store.load(cid))


_WRITER = textwrap.dedent(
    """
    import sys
    from ondevice.tui.store import HistoryStore
    store = HistoryStore(sys.argv[1])
    cid = store.create_conversation("m", system="s")
    i = 0
    while True:
        body = f"message {i} " + "x" * 200_000
        store.add_message(cid, "assistant", body, finish_reason="stop",
                          stats={"i": i, "itl_s": [0.001] * 20_000})
        if i == 0:
            print("first", flush=True)
        i += 1
    """
)


def test_store_survives_kill_mid_write(tmp_path):
    """SIGKILL a writer at random moments; every reopen sees whole messages only."""
    path = tmp_path / "h.sqlite3"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    rng = random.Random(7)
    seen = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline().strip() == b"first"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = HistoryStore(path)
        assert store.integrity_check() == "ok"
        total = 0
        for summary in store.list_conversations():
            conv = store.load(summary.id)
            for n, msg in enumerate(conv.messages):
                assert msg.content.startswith(f"message {n} ") and len(msg.content) == len(f"message {n} ") + 200_000
                assert msg.stats["i"] == n and len(msg.stats["itl_s"]) == 20_000
            total += len(conv.messages)
        assert total > seen  # each run committed at least its first message
        seen = total
        store.close()
