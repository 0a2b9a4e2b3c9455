"""The chat's controller and the frame pacing, without Textual: plain calls on a scripted fake engine."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from ondevice.tui.controller import ChatController, LoadResult
from ondevice.tui.pacing import MAX_FRAME_S, TICK_S, Frames
from ondevice.tui.session import ChatSettings
from ondevice.tui.store import HistoryError, HistoryStore

from ondevice.core.errors import ModelLoadError
from tests.tui_fakes import SCRIPT, FakeEngine


def loaded(engine: FakeEngine | None = None, **kw) -> ChatController:
    engine = engine or FakeEngine()
    c = ChatController(lambda: engine, memory_reader=lambda: (1, 2, 3), **kw)
    c.begin_task("loading")
    assert c.finish_loading(c.load()) == []
    return c


def run_turn(c: ChatController, text: str):
    turn = c.start_turn(text, f"user:{text}", f"answer:{text}")
    dropped: list[int] = []
    result, error = c.generate(turn, dropped.append)
    turn.tracker.add(turn.feed.drain())
    c.end_turn()
    return turn, result, error, dropped


def test_controller_module_needs_no_textual():
    code = "import sys, ondevice.tui.controller, ondevice.tui.pacing; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_load_then_ready():
    c = ChatController(lambda: FakeEngine(), model_label="fake")
    assert c.title == "fake" and c.status_line() is None and c.context() is None
    c.begin_task("loading")
    assert c.generating and not c.idle and not c.can_send_now
    result = c.load()
    assert result.error is None and result.session is not None and c.session is None  # nothing taken yet
    assert c.finish_loading(result) == []
    assert c.idle and c.can_send_now and not c.generating and c.busy_reason is None
    assert c.title == "fake-model-1B" and c.engine_threads == 2
    assert c.status_line() == "ready · loaded in 0.42 s · CPU · ctx 4096"


@pytest.mark.parametrize(
    "exc, text",
    [(ModelLoadError("cannot open x.gguf"), "cannot open x.gguf"), (RuntimeError("boom"), "RuntimeError: boom")],
)
def test_load_failure_fails_the_queue(exc, text):
    def broken():
        raise exc

    c = ChatController(broken)
    c.begin_task("loading")
    assert c.enqueue("early", "w1") == 1 and c.enqueue("bird", "w2") == 2
    assert c.next_queued() is None  # not loaded yet
    result = c.load()
    assert result == LoadResult(error=text)
    failed = c.finish_loading(result)
    assert [q.widget for q in failed] == ["w1", "w2"] and c.queue == []
    assert c.load_error == text and not c.generating and not c.can_send_now and c.engine is None


def test_an_engine_whose_chat_cannot_start_is_kept_for_closing(tmp_path):
    engine = FakeEngine()
    c = ChatController(lambda: engine, store=HistoryStore(tmp_path / "h.sqlite3"), resume=99)  # no conversation 99
    result = c.load()
    assert result.engine is engine and result.session is None and "99" in result.error
    c.finish_loading(result)
    assert c.engine is engine and c.session is None and c.load_error  # the caller closes c.engine on exit
    ChatController.discard(result)  # what the screen does when the app is gone
    assert engine.closed


def test_queue_goes_out_in_order_when_idle():
    c = ChatController(lambda: FakeEngine())
    c.begin_task("loading")
    c.enqueue("one", "w1")
    c.enqueue("two", "w2")
    assert c.generating
    c.finish_loading(c.load())
    assert not c.can_send_now  # the queue goes first
    assert "2 queued" in c.status_line()
    first = c.next_queued()
    assert first.text == "one" and first.widget == "w1"
    c.start_turn(first.text, first.widget, "a1")
    assert c.next_queued() is None  # busy with "one"
    c.end_turn()
    assert c.next_queued().text == "two" and c.queue == []


def test_a_turn_streams_into_its_feed_and_ends():
    c = loaded()
    turn, result, error, dropped = run_turn(c, "hello there")
    assert error is None and dropped == [] and result.generation.finish_reason == "stop"
    assert turn.tracker.count == 14 and turn.tracker.stats().output_tokens == 14
    assert c.turns == [turn] and c.turn is None and not c.generating
    assert (turn.user, turn.assistant) == ("user:hello there", "answer:hello there")


def test_generation_errors_are_one_line():
    c = loaded(FakeEngine(n_ctx=30), settings=ChatSettings(max_tokens=25))
    _, result, error, _ = run_turn(c, "a b c d e f g h i j")
    assert result is None and "nothing left to drop" in error


def test_cancel_and_current_turn():
    c = loaded()
    assert not c.cancel()  # nothing streams
    turn = c.start_turn("q", "u", "a")
    assert c.is_current(turn) and c.generating
    assert c.cancel() and turn.cancel.is_set()
    assert not c.cancel()  # already stopping
    c.clear()
    assert not c.is_current(turn) and c.turns == [] and c.turn is None


def test_dropped_turns_are_the_oldest_still_in_context():
    c = loaded()
    turns = [c.start_turn(f"t{i}", f"u{i}", f"a{i}") for i in range(4)]
    current = turns[-1]
    assert c.mark_dropped(current, 2) == turns[:2]
    assert c.mark_dropped(current, 5) == [turns[2]]  # never the current one, never twice
    assert [t.dropped for t in turns] == [True, True, True, False]


def test_context_use_and_the_warning_once():
    engine = FakeEngine(n_ctx=42)
    c = loaded(engine, settings=ChatSettings(max_tokens=20))
    ctx = c.context()
    assert (ctx.used, ctx.n_ctx, ctx.level) == (0, 42, "ok") and ctx.kv_bytes == 0
    assert c.context(30).level == "warn" and c.context(42).level == "full"
    assert c.context_warning("ok") is None
    engine.kv_cache_tokens = 24
    warning = c.context_warning("warn")
    assert warning.startswith("Context nearly full (24/42 tokens)")
    assert c.context_warning("warn") is None and c.context_warning("full") is None  # once
    assert c.context_warning("ok") is None and c.context_warning("warn")  # again after it was ok
    c.clear()
    assert c.ctx_level == "ok"


def test_settings_before_and_after_loading():
    c = ChatController(lambda: FakeEngine())
    new = ChatSettings(system="Be brief.", max_tokens=7)
    assert not c.change_settings(None) and not c.change_settings(c.settings)
    assert not c.change_settings(new) and c.settings == new  # not loaded: nothing to apply yet
    c.finish_loading(c.load())
    newer = ChatSettings(system="Be briefer.", max_tokens=7)
    assert c.change_settings(newer)
    assert c.run_task(lambda: c.apply_settings(newer)) is None
    assert c.session.chat.messages[0] == {"role": "system", "content": "Be briefer."}


def test_run_task_reports_errors_as_one_line():
    c = loaded()

    def library_error():
        raise HistoryError("disk full")

    def bug():
        raise KeyError("x")

    assert c.run_task(library_error) == "disk full"
    assert c.run_task(bug) == "KeyError: 'x'"


def test_new_chat_restore_and_export(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    c = loaded(store=store, export_dir=tmp_path / "out")
    assert c.export() is None  # nothing yet
    run_turn(c, "remember the blue door")
    cid = c.session.conversation_id
    md = c.export()
    assert md.parent == tmp_path / "out" and md.name.startswith(f"chat-{cid}-") and md.with_suffix(".json").exists()
    assert "remember the blue door" in md.read_text()
    assert c.run_task(c.new_chat) is None
    assert c.session.conversation_id is None and c.session.chat.messages == []
    assert c.conversation(None) is None
    store.set_system(cid, "S")
    conv = c.conversation(cid)
    assert c.run_task(lambda: c.restore(conv)) is None
    assert c.session.conversation_id == cid and c.settings.system == "S"
    assert [m["content"] for m in c.session.chat.messages][1] == "remember the blue door"


def test_resume_takes_the_conversation_settings(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    cid = store.create_conversation("fake", system="S", settings={"temperature": 0.3, "top_p": 0.9, "max_tokens": 64})
    store.add_message(cid, "user", "old question")
    c = ChatController(lambda: FakeEngine(), store=store, resume=cid)
    result = c.load()
    assert result.conversation.id == cid
    c.finish_loading(result)
    assert c.settings == ChatSettings("S", 0.3, 0.9, 64)


def test_history_error_is_taken_once(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    c = loaded(store=store)
    assert c.take_history_error() is None
    store.close()  # every write now fails
    _, result, _, _ = run_turn(c, "hi")
    assert result.generation.text.strip() == SCRIPT.strip()
    assert c.take_history_error() and c.take_history_error() is None


def test_memory_reader_is_polled():
    assert loaded().memory() == (1, 2, 3)


def test_turn_feed_is_thread_safe_handoff():
    c = loaded(FakeEngine(hold_after=3))
    turn = c.start_turn("q", "u", "a")
    worker = threading.Thread(target=lambda: c.generate(turn, lambda n: None))
    worker.start()
    assert c.engine.held.wait(5)
    c.cancel()
    c.engine.gate.set()
    worker.join(5)
    assert [ev.text for ev in turn.feed.drain()] == ["Here ", "is ", "a "]


def test_frames_are_paced_by_the_ui_cpu_spent():
    frames = Frames(ui_budget=0.04)
    assert frames.pace(1.0) == TICK_S  # the first frame: nothing spent yet
    assert frames.pace(1.002) == TICK_S  # 2 ms / 4% = 50 ms: no faster than TICK_S
    assert frames.pace(1.010) == pytest.approx(0.2)  # 8 ms / 4%
    assert frames.pace(2.0) == MAX_FRAME_S  # never slower than MAX_FRAME_S
    assert frames.cpu_s == 2.0


def test_screens_and_widgets_never_import_the_app():
    """Attributes down: screens get the controller at construction, never the app's module."""
    import ast
    from pathlib import Path

    import ondevice.tui

    root = Path(ondevice.tui.__file__).parent
    paths = [*root.glob("screens/*.py"), *root.glob("widgets/*.py"), root / "controller.py", root / "pacing.py"]
    assert len(paths) > 8 and (root / "screens" / "chat.py") in paths
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.endswith("tui.app") for n in names), f"{path.name} imports the app"


def test_the_chat_says_when_its_answers_keep_missing_a_cached_timing(tmp_path, monkeypatch):
    """Three answers decoding far slower than the model's timing predicts (a machine that slowed under a cached
    timing): the third one's note says so and how to re-time; a predictor that is not timed says nothing."""
    from ondevice.roofline import TimedPredictor
    from ondevice.roofline.timing import ShapeTiming

    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("ondevice.probing.drift.BUSY_CORES", float("inf"))  # the suite may run beside a busy one
    engine = FakeEngine(script=" ".join(["word"] * 40))
    c = loaded(engine)
    assert c.drift_warning(run_turn(c, "untimed")[1].generation) is None
    timing = ShapeTiming(decode=((1, 1e-6), (4096, 2e-6)), prefill=((0, 16, 1e-5),), created_unix_s=1.0)
    engine.predictor = TimedPredictor(engine.info.spec, engine.predictor.calibration, timing)
    notes = [c.drift_warning(run_turn(c, f"turn {i}")[1].generation) for i in range(3)]
    assert notes[:2] == [None, None] and notes[2] is not None
    assert "slower than predicted from this model's timing" in notes[2] and "ondevice chat --retime" in notes[2]
