"""Pilot tests of the chat app on a scripted fake engine: loading, the other screens, history,
export, quitting, layout."""

from __future__ import annotations

import threading

import pytest
from ondevice.tui.app import ChatApp
from ondevice.tui.screens.help import HelpScreen
from ondevice.tui.screens.history import HistoryScreen
from ondevice.tui.session import ChatSettings
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.stats import StatsPanel
from ondevice.tui.widgets.transcript import AssistantMessage, UserMessage

from ondevice.core.errors import ModelLoadError
from tests.tui_fakes import FakeEngine, aio
from tests.tui_pilot import FIXED_MEMORY, make_app, notes, send, send_until_held, settle, text_of, until


@aio
async def test_typing_while_loading_queues_the_message(tmp_path):
    engine = FakeEngine()
    release = threading.Event()

    def slow_factory():
        release.wait(10)
        return engine

    app = ChatApp(slow_factory, memory_reader=FIXED_MEMORY)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "loading fake" in text_of(app, "#status") or "loading" in text_of(app, "#status")
        app.chat_screen.query_one("#prompt").value = "early bird"
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat_screen.query_one(UserMessage).has_class("queued")
        assert not engine.calls
        release.set()
        await settle(pilot, app)
        assert engine.calls[0]["text"] == "early bird"
        assert not app.chat_screen.query_one(UserMessage).has_class("queued")
        assert app.chat_screen.query_one(AssistantMessage).finished


@aio
async def test_load_failure_is_shown_on_screen():
    def broken():
        raise ModelLoadError("llama.cpp could not open broken.gguf")

    app = ChatApp(broken, memory_reader=FIXED_MEMORY)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert "model failed to load: llama.cpp could not open broken.gguf" in text_of(app, "#status")
        assert app.chat_screen.query_one("#status").has_class("status-error")
        assert any("Could not load" in n for n in notes(app))
        await send(pilot, app, "hello?")
        assert any("No model loaded" in n for n in notes(app))


@aio
async def test_unexpected_load_exception_has_no_traceback_on_screen():
    def broken():
        raise RuntimeError("boom")

    app = ChatApp(broken, memory_reader=FIXED_MEMORY)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert "RuntimeError: boom" in text_of(app, "#status")


@aio
async def test_help_screen_opens_and_closes(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "Ctrl+N" in str(app.screen.query_one("#help-keys").render())
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@aio
async def test_history_picker_reopens_a_conversation(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "remember the blue door")
        old_id = app.controller.session.conversation_id
        await pilot.press("ctrl+n")
        await settle(pilot, app)
        await send(pilot, app, "something else")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        option_list = app.screen.query_one("#history-list")
        ids = [int(option_list.get_option_at_index(i).id) for i in range(option_list.option_count)]
        option_list.highlighted = ids.index(old_id)
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.controller.session.conversation_id == old_id
        assert app.chat_screen.query_one(UserMessage).text == "remember the blue door"
        assert [m["content"] for m in app.controller.session.chat.messages][0] == "remember the blue door"
        assert any("Reopened" in n for n in notes(app))
        await send(pilot, app, "continue")
    assert [m.role for m in app.controller.store.load(old_id).messages] == ["user", "assistant", "user", "assistant"]


@aio
async def test_resume_reopens_last_conversation(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    cid = store.create_conversation("fake", system="S", settings={"temperature": 0.3, "top_p": 0.9, "max_tokens": 64})
    store.add_message(cid, "user", "old question")
    store.add_message(cid, "assistant", "old answer", finish_reason="stop", stats={})
    app = ChatApp(lambda: FakeEngine(), store=store, resume=cid, memory_reader=FIXED_MEMORY)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.controller.settings == ChatSettings("S", 0.3, 0.9, 64)
        assert app.chat_screen.query_one(AssistantMessage).text == "old answer"
        assert app.controller.session.chat.messages[0] == {"role": "system", "content": "S"}


@aio
async def test_export_writes_markdown_and_json(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+s")  # nothing yet: a warning, no file
        await pilot.pause()
        assert not list(tmp_path.glob("chat-*"))
        await send(pilot, app, "export me")
        await pilot.press("ctrl+s")
        await pilot.pause()
    md = list(tmp_path.glob("chat-*.md"))
    js = list(tmp_path.glob("chat-*.json"))
    assert len(md) == 1 and len(js) == 1
    assert "## User\n\nexport me" in md[0].read_text()


@aio
async def test_quit_while_generating_cancels(tmp_path):
    engine = FakeEngine(hold_after=2)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send_until_held(pilot, app, engine, "long answer")
        turn = app.controller.turn
        await pilot.press("ctrl+q")
        engine.gate.set()
    assert turn.cancel.is_set()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@aio
async def test_layout_fits(size, tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "hello")
        screen = app.chat_screen
        prompt = screen.query_one("#prompt").region
        stats = screen.query_one(StatsPanel).region
        assert prompt.bottom <= size[1] - 1 and prompt.width >= 40
        assert stats.right <= size[0] and not prompt.overlaps(stats)


@aio
async def test_gil_switch_interval_is_restored_after_the_app():
    import sys

    before = sys.getswitchinterval()
    app = ChatApp(lambda: FakeEngine(), memory_reader=FIXED_MEMORY)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert sys.getswitchinterval() <= 0.0005
    assert sys.getswitchinterval() == before


@aio
async def test_answer_box_shrinks_to_its_text_when_done(tmp_path):
    engine = FakeEngine(script="Short.")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "hi")
        answer = app.chat_screen.query_one(AssistantMessage)
        assert answer.stream._reserved == 0 and answer.stream.region.height == 0
        assert answer.region.height == 4  # border, the answer line, the footer line, border: no blank rows


@aio
async def test_view_follows_a_long_streaming_answer_then_sticks_to_the_bottom(tmp_path):
    long_script = " ".join(f"word{i}" for i in range(200))
    engine = FakeEngine(script=long_script, hold_after=150)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        answer = await send_until_held(pilot, app, engine, "go")
        await until(pilot, lambda: answer.stream.text.count("word") == 150)
        await pilot.pause(0.1)
        transcript = app.chat_screen.query_one("#transcript")
        view = transcript.scrollable_content_region
        stream = answer.stream
        assert stream.row_count > view.height  # longer than the view: it had to scroll
        last_row_y = stream.region.y + stream.row_count - 1
        assert view.y <= last_row_y < view.bottom  # the newest text is on screen
        assert stream.region.height > stream.row_count  # the box was sized ahead, no growth needed
        engine.gate.set()
        await settle(pilot, app)
        await pilot.pause(0.1)
        assert answer.stream.region.height == 0
        assert transcript.scroll_y == transcript.max_scroll_y  # stuck to the bottom again


@aio
async def test_the_screen_tells_the_app_the_model_name(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    assert app.sub_title == "fake"
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.sub_title == "fake-model-1B" == app.controller.title  # ModelNamed bubbled up
        assert app.chat_screen.controller is app.controller
