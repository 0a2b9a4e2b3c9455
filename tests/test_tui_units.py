"""Pure parts of the TUI: live stats arithmetic, charts, settings, session logic, the CLI's checks."""

from __future__ import annotations

import math
import threading
import time

import pytest
from ondevice.tui.app import terminal_theme
from ondevice.tui.live import LiveFeed, LiveTracker, context_level
from ondevice.tui.session import ChatSession, ChatSettings
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.charts import column_cells, hbar
from ondevice.tui.widgets.stats import fmt_bytes, fmt_ms, fmt_rate

from ondevice.cli.main import main
from ondevice.core.errors import ContextOverflowError, InvalidParameterError
from ondevice.core.results import Generation, Timings, TokenEvent
from tests.tui_fakes import FakeEngine


class StepModel:
    def step_s(self, n_ctx: int) -> tuple[float, float]:
        return 0.010 + n_ctx * 1e-6, 0.020 + n_ctx * 1e-6


def events(times, start_ctx=10):
    return [TokenEvent(i, 100 + i, f"w{i} ", t, start_ctx + i) for i, t in enumerate(times)]


def test_feed_is_fifo_and_drains_empty():
    feed = LiveFeed()
    evs = events([0.1, 0.2, 0.3])
    for ev in evs:
        feed.push(ev)
    assert feed.drain() == evs and feed.drain() == []


def test_feed_from_another_thread_loses_nothing():
    feed = LiveFeed()
    evs = events([i * 0.001 for i in range(5000)])
    thread = threading.Thread(target=lambda: [feed.push(e) for e in evs])
    thread.start()
    got = []
    deadline = time.monotonic() + 10  # a lost event fails here instead of spinning for ever
    while (thread.is_alive() or len(got) < len(evs)) and time.monotonic() < deadline:
        got += feed.drain()
    thread.join(timeout=1)
    assert got == evs


def test_tracker_running_stats_match_the_definitions():
    tracker = LiveTracker(StepModel())
    times = [0.5, 0.52, 0.55, 0.56]
    assert tracker.add(events(times[:2])) == "w0 w1 "
    assert tracker.add(events(times)[2:]) == "w2 w3 "
    s = tracker.stats()
    assert s.output_tokens == 4 and s.ttft_s == 0.5
    assert s.last_itl_s == pytest.approx(0.01)
    assert s.tpot_s == pytest.approx((0.56 - 0.5) / 3)
    assert s.decode_tok_s == pytest.approx(3 / 0.06)
    assert s.n_ctx_used == 13
    assert s.ceiling_tok_s == pytest.approx(1 / (0.010 + 13e-6))
    assert s.predicted_step_s == pytest.approx(0.020 + 13e-6)
    assert s.efficiency == pytest.approx(s.decode_tok_s / s.predicted_tok_s)
    assert list(tracker.itl_s) == pytest.approx([0.02, 0.03, 0.01])


def test_tracker_prefers_the_final_generation():
    tracker = LiveTracker(None)
    tracker.add(events([0.1, 0.3]))
    t = Timings(0.01, 0.05, 0.1, (0.2,), 0.3, 8, 2)
    g = Generation(
        "w0 w1 ", (100, 101), "cancelled", 12, 4, t, ceiling_tok_s=9.0, predicted_tok_s=6.0, predicted_step_s=(0.2, 0.2)
    )
    tracker.finish(g)
    s = tracker.stats()
    assert (s.prefill_tok_s, s.cached_prompt_tokens, s.prompt_tokens) == (8 / 0.05, 4, 12)
    assert s.finish_reason == "cancelled" and s.ceiling_tok_s == 9.0 and s.predicted_tok_s == 6.0
    assert s.predicted_step_s == 0.2  # from the generation's per-token prediction


def test_tracker_without_tokens_or_predictor():
    s = LiveTracker(None).stats()
    assert s.output_tokens == 0 and s.ttft_s is None and s.decode_tok_s is None and s.efficiency is None
    one = LiveTracker(None)
    one.add(events([0.2]))
    assert one.stats().tpot_s is None and one.stats().ttft_s == 0.2


def test_context_level():
    assert context_level(0, 0) == "ok"
    assert context_level(100, 1000) == "ok"
    assert context_level(800, 1000) == "warn"
    assert context_level(500, 1000, reserve=600) == "warn"
    assert context_level(1000, 1000) == "full"


def test_hbar():
    assert hbar(0.0, 4) == "░░░░" and hbar(1.0, 4) == "████" and hbar(2.0, 4) == "████"
    assert hbar(0.5, 4) == "██░░" and hbar(None, 3) == "···" and hbar(math.nan, 2) == "··"
    assert hbar(1 / 16, 2) == "▏░"
    assert all(len(hbar(f / 37, 9)) == 9 for f in range(38))


def test_column_cells_scale_reference_and_slow_bars():
    grid = column_cells([1.0, 2.0, 4.0], ref=2.0, rows=2)
    assert len(grid) == 2 and all(len(row) == 3 for row in grid)
    # top = 4.2: the 4.0 bar reaches into the top row, drawn as slow (> 1.1 x ref)
    assert grid[0][2] == ("▇", "slow") and grid[0][0] == (" ", "blank")  # 15 of 16 eighths
    # ref 2.0 sits in the bottom row (level 7.6 of 16 eighths): that row is the reference band
    assert [k for _, k in grid[1]] == ["ref", "ref", "ref"]
    assert grid[1][2][0] == "█" and grid[1][0][0] == "▄"  # 1.0 -> 4 eighths
    assert column_cells([], None, 3) == [[], [], []]
    assert column_cells([0.0], None, 1) == [[(" ", "blank")]]


def test_column_cells_draws_reference_where_bars_are_short():
    grid = column_cells([0.1, 0.1, 1.0], ref=0.9, rows=3)
    top_row_with_ref = [row for row in grid if any(k == "ref" for _, k in row)]
    assert top_row_with_ref and top_row_with_ref[0][0] == ("─", "ref")


def test_formatters():
    assert fmt_ms(None) == "–" and fmt_ms(0.0123) == "12.3 ms" and fmt_ms(0.5) == "500 ms" and fmt_ms(12.0) == "12.0 s"
    assert fmt_rate(None) == "–" and fmt_rate(42.04) == "42.0 tok/s" and fmt_rate(1234.0) == "1234 tok/s"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(3 << 20) == "3.0 MiB" and fmt_bytes(None) == "–"


def test_settings_validation():
    assert ChatSettings(" hi ", 0, 1, 3).validated() == ChatSettings("hi", 0.0, 1.0, 3)
    assert ChatSettings("   ").validated().system is None
    for bad, name in (
        (ChatSettings(temperature=-0.1), "temperature"),
        (ChatSettings(temperature=math.nan), "temperature"),
        (ChatSettings(top_p=0.0), "top_p"),
        (ChatSettings(top_p=1.01), "top_p"),
        (ChatSettings(max_tokens=0), "max_tokens"),
        (ChatSettings(max_tokens=2.5), "max_tokens"),
    ):
        with pytest.raises(InvalidParameterError, match=name):
            bad.validated()


def test_session_drops_until_it_fits_and_records_everything(tmp_path):
    engine = FakeEngine(n_ctx=60)
    store = HistoryStore(tmp_path / "h.sqlite3")
    session = ChatSession(engine, ChatSettings(system="S", max_tokens=20), store, "fake")
    dropped = []
    for n in range(3):
        result = session.run_turn(f"question number {n}", threading.Event(), lambda ev: None, dropped.append)
        assert result.generation.finish_reason == "stop"
    assert dropped and sum(dropped) >= 1
    assert session.chat.messages[0] == {"role": "system", "content": "S"}
    roles = [m.role for m in store.load(session.conversation_id).messages]
    assert roles.count("user") == 3 and roles.count("assistant") == 3 and "note" in roles


def test_session_refuses_a_turn_that_cannot_fit():
    session = ChatSession(FakeEngine(n_ctx=20), ChatSettings(max_tokens=19))
    with pytest.raises(ContextOverflowError, match="nothing left to drop"):
        session.run_turn("one two three", threading.Event(), lambda ev: None)
    assert session.chat.messages == []


def test_session_system_prompt_changes_in_place():
    session = ChatSession(FakeEngine(), ChatSettings())
    session.run_turn("hi", threading.Event(), lambda ev: None)
    session.apply_settings(ChatSettings(system="New"))
    assert session.chat.messages[0] == {"role": "system", "content": "New"}
    session.apply_settings(ChatSettings(system="Newer"))
    assert session.chat.messages[0]["content"] == "Newer" and len(session.chat.messages) == 3
    session.apply_settings(ChatSettings(system=None))
    assert session.chat.messages[0]["role"] == "user"


def test_session_survives_a_broken_history(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    session = ChatSession(FakeEngine(), ChatSettings(), store, "fake")
    store.close()  # every write now fails
    result = session.run_turn("hi", threading.Event(), lambda ev: None)
    assert result.generation.text and session.history_error


def test_terminal_theme():
    assert terminal_theme({"COLORFGBG": "0;15"}) == "ansi-light"
    assert terminal_theme({"COLORFGBG": "15;0"}) == "ansi-dark"
    assert terminal_theme({}) == "ansi-dark"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["chat", "--temperature", "-1"], "temperature"),
        (["chat", "--top-p", "0"], "top_p"),
        (["chat", "--max-tokens", "0"], "max_tokens"),
        (["chat", "--n-ctx", "4"], "n_ctx 4 is below"),
        (["chat", "no-such-model-xyz"], "no-such-model-xyz"),
        (["chat", "--export", "1"], "--out"),
        (["chat", "--export", "77", "--out", "x.md"], "no conversation with id 77"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main(argv + ["--history-db", str(tmp_path / "h.sqlite3")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ondevice: error:") and message in err and "\n" not in err


def test_cli_needs_a_terminal(tiny_model, tmp_path, capsys):
    assert main(["chat", str(tiny_model), "--history-db", str(tmp_path / "h.sqlite3")]) == 2
    assert "needs a terminal" in capsys.readouterr().err


def test_cli_list_and_export(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    store = HistoryStore(db)
    cid = store.create_conversation("gemma")
    store.add_message(cid, "user", "listed question")
    store.close()
    assert main(["chat", "--list", "--history-db", str(db)]) == 0
    assert "listed question" in capsys.readouterr().out
    out = tmp_path / "c.json"
    assert main(["chat", "--export", str(cid), "--out", str(out), "--history-db", str(db)]) == 0
    assert '"listed question"' in out.read_text()


def test_cli_does_not_import_the_tui_until_chat_runs():
    import subprocess
    import sys

    code = "import sys; from ondevice.cli.main import build_parser; build_parser(); print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cli_resume_ids(tmp_path):
    from ondevice.cli.chat import _resume_id

    store = HistoryStore(tmp_path / "h.sqlite3")
    assert _resume_id(store, None) is None
    with pytest.raises(InvalidParameterError, match="no saved conversation"):
        _resume_id(store, "last")
    with pytest.raises(InvalidParameterError, match="history"):
        _resume_id(None, "last")
    cid = store.create_conversation("m")
    store.add_message(cid, "user", "q")
    assert _resume_id(store, "last") == cid and _resume_id(store, str(cid)) == cid
    with pytest.raises(InvalidParameterError, match="integer"):
        _resume_id(store, "abc")


def test_wrap_cells():
    from ondevice.tui.widgets.stream import wrap_cells

    assert wrap_cells("hello world this is a test of wrapping", 10) == [
        "hello",
        "world this",
        "is a test",
        "of",
        "wrapping",
    ]
    assert wrap_cells("abcdefghijklmnopqrstuvwxyz", 10) == ["abcdefghij", "klmnopqrst", "uvwxyz"]
    assert wrap_cells("日本語のテキストを折り返す", 10) == ["日本語のテ", "キストを折", "り返す"]  # 2 cells each
    assert wrap_cells("", 10) == [""] and wrap_cells("short", 0) == ["short"]


def test_streaming_rows_of_the_open_block_match_a_full_wrap():
    import random

    from ondevice.tui.widgets.stream import StreamingMarkdown, wrap_cells

    text = "The keeper climbed the stairs, one hundred and twelve of them.\nA storm came in. " * 6
    rng = random.Random(3)
    stream = StreamingMarkdown()
    stream._width = 23  # as if laid out 23 cells wide (no app needed: no block is finished)
    shown = ""
    while len(shown) < len(text):
        shown = text[: len(shown) + rng.randint(1, 9)]
        first_changed = stream._take(shown)
        assert first_changed <= stream.row_count
    assert stream._rows == [row for line in text.split("\n") for row in wrap_cells(line, 23)]
    assert stream.open_text == text and not stream._done


def test_streaming_rows_drop_control_codes_and_expand_tabs():
    from ondevice.tui.widgets.stream import StreamingMarkdown

    stream = StreamingMarkdown()
    stream._width = 40
    stream._take("a\tb\rc\x1b[31md")
    assert stream._rows == ["a    bc[31md"]  # nothing that moves the cursor or restyles the terminal
    assert stream.text == "a\tb\rc\x1b[31md"  # the answer itself is kept as it came


@pytest.mark.parametrize(
    "text, end",
    [
        ("no blank line yet", 0),
        ("One.\n\nTwo", len("One.\n\n")),
        ("One.\n\nTwo.\n\n", len("One.\n\nTwo.\n\n")),
        ("```py\nx = 1\n\ny = 2", 0),  # a blank line inside an open fence ends nothing
        ("Intro.\n\n```py\nx = 1\n\ny = 2", len("Intro.\n\n")),
        ("```py\nx = 1\n\ny = 2\n```\n\nAfter", len("```py\nx = 1\n\ny = 2\n```\n\n")),
        ("~~~\na\n\nb\n~~~\n\n", len("~~~\na\n\nb\n~~~\n\n")),
    ],
)
def test_finished_blocks_end_at_a_blank_line_outside_code_fences(text, end):
    from ondevice.tui.widgets.stream import finished_blocks_end

    assert finished_blocks_end(text) == end


def test_ui_budget_shrinks_when_the_engine_takes_every_core():
    from ondevice.tui.pacing import UI_CPU_BUDGET, UI_CPU_BUDGET_NO_SPARE_CORE, no_spare_core, ui_cpu_budget

    assert UI_CPU_BUDGET_NO_SPARE_CORE < UI_CPU_BUDGET
    assert ui_cpu_budget(2, 2) == ui_cpu_budget(4, 2) == UI_CPU_BUDGET_NO_SPARE_CORE
    assert ui_cpu_budget(4, 8) == UI_CPU_BUDGET
    assert ui_cpu_budget(None, 2) == ui_cpu_budget(2, None) == UI_CPU_BUDGET  # unknown: the usual budget
    assert no_spare_core(2, 2) and no_spare_core(3, 2) and not no_spare_core(4, 8) and not no_spare_core(None, 2)


def test_tracker_shows_the_predicted_ttft_before_the_first_token():
    tracker = LiveTracker(StepModel(), 0, predicted_ttft_s=0.12)
    s = tracker.stats()
    assert s.predicted_ttft_s == 0.12 and s.ttft_s is None and s.e2e_s is None


def test_controller_predicts_the_ttft_of_the_next_message():
    from ondevice.tui.controller import ChatController

    from tests.tui_fakes import FakeEngine

    engine = FakeEngine()
    ctl = ChatController.__new__(ChatController)
    ctl.engine, ctl.session = engine, type("S", (), {"chat": engine.chat()})()
    ids = engine.chat().prompt_tokens("hello there")
    assert ctl._predicted_ttft("hello there") == pytest.approx(engine.predictor.ttft_s(len(ids), 0))
    engine.kv_cache_tokens = 5  # a cached prefix shortens it
    assert ctl._predicted_ttft("hello there") == pytest.approx(engine.predictor.ttft_s(len(ids), 5))
    ctl.session = None
    assert ctl._predicted_ttft("hello there") is None
