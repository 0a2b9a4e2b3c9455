"""A damaged chat history database: every row read back goes through one validated loader.

Each case writes a real history with HistoryStore, damages it with sqlite3 (as another program or a
bad disk would), and runs the CLI entry point: the command goes on with the damaged values replaced
or the bad row left out, says so in a line naming the file, and never shows a traceback."""

from __future__ import annotations

import json
import sqlite3

import pytest
from ondevice.tui.controller import ChatController
from ondevice.tui.store import HistoryStore

from ondevice.cli import chat as chat_cli
from ondevice.cli.main import main
from tests.tui_fakes import FakeEngine

# (table, column, SQL value expression): what a damaged row holds
DAMAGE = {
    "stats-not-json": ("messages", "stats_json", "'{not json'"),
    "stats-deep": ("messages", "stats_json", "'" + "[" * 5000 + "'"),
    "stats-a-list": ("messages", "stats_json", "'[1, 2]'"),
    "stats-blob": ("messages", "stats_json", "X'80FF00'"),
    "stats-timings-wrong-types": ("messages", "stats_json", """'{"timings": {"ttft_s": "soon", "n": []}}'"""),
    "stats-timings-a-list": ("messages", "stats_json", """'{"timings": [1]}'"""),
    "message-time-text": ("messages", "created_at", "'yesterday'"),
    "content-blob": ("messages", "content", "X'68698081'"),
    "finish-blob": ("messages", "finish_reason", "X'00'"),
    "role-unknown": ("messages", "role", "'robot'"),
    "settings-not-json": ("conversations", "settings_json", "'{{{'"),
    "settings-a-string": ("conversations", "settings_json", "'\"hot\"'"),
    "settings-nested": ("conversations", "settings_json", """'{"temperature": {"a": 1}}'"""),
    "settings-huge-number": ("conversations", "settings_json", "'{\"top_p\": 1e999}'"),
    "title-blob": ("conversations", "title", "X'1B5B324A'"),
    "updated-text": ("conversations", "updated_at", "'never'"),
    "updated-past-year-9999": ("conversations", "updated_at", "1e308"),
    "created-text": ("conversations", "created_at", "'never'"),
    "system-blob": ("conversations", "system", "X'FFFE'"),
}


# valid JSON objects whose figures are not numbers: no damage to say, the footer leaves those figures out
QUIET = {"stats-timings-wrong-types", "stats-timings-a-list"}


def history(tmp_path) -> tuple:
    """A history with one conversation (a user message and an answer with stats); (db path, id)."""
    db = tmp_path / "h.sqlite3"
    store = HistoryStore(db)
    cid = store.create_conversation("tiny.gguf", system="S", settings={"temperature": 0.5, "top_p": 0.9})
    store.add_message(cid, "user", "what is the blue door?")
    store.add_message(cid, "assistant", "a door", finish_reason="stop", stats={"timings": {"ttft_s": 0.1}})
    store.close()
    return db, cid


def damage(db, case: str) -> None:
    table, column, value = DAMAGE[case]
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints=ON")  # the role CHECK: another program need not honour it
    con.execute(f"UPDATE {table} SET {column} = {value} WHERE id = (SELECT MAX(id) FROM {table})")  # the answer
    con.commit()
    con.close()


def no_traceback(err: str) -> None:
    assert "Traceback" not in err and all(line.startswith("ondevice: ") for line in err.splitlines())


@pytest.mark.parametrize("case", list(DAMAGE))
@pytest.mark.parametrize("suffix", [".md", ".json"])
def test_export_of_a_damaged_row_goes_on_and_names_the_file(tmp_path, capsys, case, suffix):
    db, cid = history(tmp_path)
    damage(db, case)
    out = tmp_path / f"out{suffix}"
    rc = main(["chat", "--export", str(cid), "--out", str(out), "--history-db", str(db)])
    err = capsys.readouterr().err
    no_traceback(err)
    assert rc == 0, err
    assert (f"history {db}:" in err) is (case not in QUIET)  # the damage is said, naming the database
    text = out.read_text()
    if suffix == ".json":
        json.loads(text)
    assert "what is the blue door?" in text  # the undamaged row is all there


@pytest.mark.parametrize("case", list(DAMAGE))
def test_list_of_a_damaged_history_goes_on(tmp_path, capsys, case):
    db, cid = history(tmp_path)
    damage(db, case)
    rc = main(["chat", "--list", "--history-db", str(db)])
    out, err = capsys.readouterr()
    no_traceback(err)
    assert rc == 0, err
    assert out.split()[0] == str(cid)
    assert "\x1b" not in out


def test_an_undamaged_history_says_nothing(tmp_path, capsys):
    db, cid = history(tmp_path)
    assert main(["chat", "--list", "--history-db", str(db)]) == 0
    assert main(["chat", "--export", str(cid), "--out", str(tmp_path / "o.md"), "--history-db", str(db)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case", ["stats-not-json", "settings-not-json", "updated-text", "role-unknown"])
def test_resume_of_a_damaged_conversation_opens_it(tmp_path, capsys, monkeypatch, tiny_model, case):
    db, cid = history(tmp_path)
    damage(db, case)
    opened = {}
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setattr("ondevice.llama.guard.cpu_buffer_verdict", lambda: None)
    monkeypatch.setattr(
        chat_cli, "_run_app", lambda path, settings, store, resume, kw, sampling: opened.update(resume=resume)
    )
    for resume in ("last", str(cid)):
        rc = main(["chat", str(tiny_model), "--resume", resume, "--history-db", str(db)])
        err = capsys.readouterr().err
        no_traceback(err)
        assert rc == 0 and opened["resume"] == cid, err
    assert f"history {db}:" in err


def test_the_damage_lines_are_bounded(tmp_path, capsys):
    db, cid = history(tmp_path)
    store = HistoryStore(db)
    for i in range(20):
        store.add_message(cid, "assistant", f"answer {i}", stats={"n": i})
    store.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE messages SET stats_json = '{not json'")
    con.commit()
    con.close()
    assert main(["chat", "--export", str(cid), "--out", str(tmp_path / "o.md"), "--history-db", str(db)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == chat_cli.MAX_DAMAGE_LINES + 1 and "more damaged values" in err[-1]


@pytest.mark.parametrize(
    "settings",
    ['{"temperature": "hot"}', '{"temperature": 1e9}', '{"top_p": -1}', '{"max_tokens": 0.5}', '{"max_tokens": true}'],
)
def test_a_conversation_with_bad_stored_settings_reopens_with_the_current_ones(tmp_path, settings):
    db, cid = history(tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE conversations SET settings_json = ?", (settings,))
    con.commit()
    con.close()
    store = HistoryStore(db)
    c = ChatController(lambda: FakeEngine(), memory_reader=lambda: (1, 2, 3), store=store, resume=cid)
    c.begin_task("loading")
    result = c.load()
    assert result.error is None and result.conversation.id == cid
    assert c.finish_loading(result) == []
    assert c.settings.system == "S" and c.settings.max_tokens >= 1 and 0 < c.settings.top_p <= 1
    store.close()


def test_a_file_that_is_not_a_database_is_one_line_naming_it(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    db.write_bytes(b"not a database at all" * 100)
    assert main(["chat", "--list", "--history-db", str(db)]) == 2
    err = capsys.readouterr().err
    assert str(db) in err and len(err.strip().splitlines()) == 1


# values another program could leave in any column: blobs, text, numbers out of range, JSON of every shape
RANDOM_VALUES = [
    "X'00'",
    "X'FFFEFD'",
    "''",
    "'x'",
    "-1",
    "1e308",
    "9223372036854775807",
    "'{'",
    "'[]'",
    "'null'",
    "'{\"timings\": null}'",
    '\'{"temperature": -5, "top_p": 2}\'',
    "'" + '{"a":' * 200 + "1" + "}" * 200 + "'",
    "'\x1b[2J\x07'",
    "zeroblob(70000)",
]
COLUMNS = [("conversations", c) for c in ("title", "model", "system", "settings_json", "created_at", "updated_at")] + [
    ("messages", c) for c in ("role", "content", "finish_reason", "stats_json", "created_at")
]


@pytest.mark.hostile_slow
@pytest.mark.parametrize("seed", range(60))
def test_random_damage_never_gives_a_traceback(tmp_path, capsys, seed):
    import random

    rng = random.Random(seed)
    db, cid = history(tmp_path)
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints=ON")
    for table, column in rng.sample(COLUMNS, rng.randint(1, 4)):
        con.execute(
            f"UPDATE {table} SET {column} = {rng.choice(RANDOM_VALUES)} WHERE id = (SELECT MAX(id) FROM {table})"
        )
    con.commit()
    con.close()
    for argv in (["--list"], ["--export", str(cid), "--out", str(tmp_path / "o.json")]):
        rc = main(["chat", *argv, "--history-db", str(db)])
        err = capsys.readouterr().err
        no_traceback(err)
        assert rc == 0, err
    json.loads((tmp_path / "o.json").read_text())
