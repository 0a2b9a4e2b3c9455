"""Pilot tests of the chat app on a scripted fake engine (deterministic, no llama.cpp)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ondevice.errors import ModelLoadError
from tests.tui_fakes import SCRIPT, FakeEngine, aio
from ondevice.tui.app import ChatApp
from ondevice.tui.screens.help import HelpScreen
from ondevice.tui.screens.history import HistoryScreen
from ondevice.tui.screens.settings import SettingsScreen
from ondevice.tui.session import ChatSettings
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.stats import StatsPanel
from ondevice.tui.widgets.transcript import AssistantMessage, Note, UserMessage

FIXED_MEMORY = lambda: (123 << 20, 4 << 30, 16 << 30)  # noqa: E731


def make_app(engine=None, tmp_path=None, **kw) -> ChatApp:
    engine = engine or FakeEngine()
    store = HistoryStore(tmp_path / "h.sqlite3") if tmp_path is not None else None
    return ChatApp(
        lambda: engine, store=store, model_label="fake", memory_reader=FIXED_MEMORY, export_dir=tmp_path, **kw
    )


async def settle(pilot, app: ChatApp, timeout_s: float = 10.0) -> None:
    """Wait until the model is loaded, nothing streams and nothing is queued."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (app.controller.session is None and app.controller.load_error is None) or app.controller.generating:
        assert loop.time() < deadline, "app did not settle"
        await pilot.pause(0.02)
    await pilot.pause()


async def send(pilot, app: ChatApp, text: str, timeout_s: float = 10.0) -> None:
    app.chat_screen.query_one("#prompt").value = text
    await pilot.press("enter")
    await settle(pilot, app, timeout_s)


async def send_until_held(pilot, app: ChatApp, engine: FakeEngine, text: str) -> AssistantMessage:
    """Send `text` and wait until the fake engine holds mid-answer; the answer's widget."""
    app.chat_screen.query_one("#prompt").value = text
    await pilot.press("enter")
    await asyncio.get_running_loop().run_in_executor(None, engine.held.wait, 5)
    return app.chat_screen.query_one(AssistantMessage)


async def until(pilot, holds, tries: int = 100) -> None:
    """Pause in 20 ms steps until holds() is true, `tries` times at most (the caller asserts)."""
    for _ in range(tries):
        if holds():
            return
        await pilot.pause(0.02)


def text_of(app: ChatApp, selector: str) -> str:
    return str(app.chat_screen.query_one(selector).render())


def stats_text(app: ChatApp, section: str) -> str:
    return app.chat_screen.query_one(StatsPanel).section_text(section)


def notes(app: ChatApp) -> list[str]:
    return [n.text for n in app.chat_screen.query(Note)]


@aio
async def test_send_streams_answer_and_fills_stats(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert "loaded in 0.42 s" in text_of(app, "#status")
        await send(pilot, app, "hello there")
        answer = app.chat_screen.query_one(AssistantMessage)
        assert answer.text == " ".join(w + " " for w in SCRIPT.split(" ")).replace("  ", " ")[: len(answer.text)]
        assert answer.text.strip() == SCRIPT.strip()
        footer = str(answer.query_one(".footer").render())
        assert "TTFT 125 ms" in footer and "14 tok" in footer and footer.endswith("stop")
        live = stats_text(app, "live")
        assert "125 ms" in live and "tok/s" in live and "predicted" in live
        assert "%" in stats_text(app, "live")
        assert len(app.controller.turns[0].tracker.itl_s) == 13
        assert "/4096 tok" in stats_text(app, "ctx")
        assert "123.0 MiB" in stats_text(app, "mem")
        assert "fake-model-1B" in stats_text(app, "card")
        assert engine.calls[0]["max_tokens"] == 512 and engine.calls[0]["temperature"] == 0.8
    conv = app.controller.store.load(app.controller.store.last_conversation_id())
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].stats["timings"]["output_tokens"] == 14
    assert conv.messages[1].finish_reason == "stop"


@aio
async def test_second_turn_is_cached_and_uses_chat_history(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "one")
        await send(pilot, app, "two")
        assert len(app.chat_screen.query(AssistantMessage)) == 2
        assert [m["role"] for m in app.controller.session.chat.messages] == ["user", "assistant", "user", "assistant"]
        assert "cached" in str(app.chat_screen.query(AssistantMessage)[1].query_one(".footer").render())
        assert app.controller.turns[1].tracker.final.cached_prompt_tokens > 0


@aio
async def test_escape_cancels_and_keeps_partial_answer(tmp_path):
    engine = FakeEngine(hold_after=3)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        answer = await send_until_held(pilot, app, engine, "tell me")
        await until(pilot, lambda: answer.stream.text)  # the next frame shows the partial answer, as plain text
        assert answer.stream.text == "Here is a " and answer.stream._rows == ["Here is a "]
        await pilot.press("escape")
        engine.gate.set()
        await settle(pilot, app)
        assert answer.text == "Here is a "
        assert answer.stream.text == "" and answer.stream.region.height == 0  # all of it went to the Markdown
        assert answer.has_class("cancelled")
        assert str(answer.query_one(".footer").render()).endswith("cancelled")
        # the engine stays usable: the next message streams in full
        engine.hold_after = None
        await send(pilot, app, "again")
        assert app.chat_screen.query(AssistantMessage)[1].text.strip() == SCRIPT.strip()
    conv = app.controller.store.load(app.controller.store.last_conversation_id())
    assert conv.messages[1].finish_reason == "cancelled" and conv.messages[1].content == "Here is a "


@aio
async def test_finished_blocks_stream_as_markdown_with_no_layout_pass(tmp_path):
    engine = FakeEngine(hold_after=6)  # held after "Here is a **short** answer.\n\n- first "
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        answer = await send_until_held(pilot, app, engine, "tell me")
        stream = answer.stream
        await until(pilot, lambda: stream.text.endswith("first "))
        rows = [stream.render_line(y).text.rstrip() for y in range(stream.row_count)]
        assert rows == ["Here is a short answer.", "", "- first"]  # the paragraph as Markdown, the open block as text
        assert stream.render_line(0).text.startswith("Here is a short")
        assert any(seg.style and seg.style.bold for seg in stream.render_line(0))  # **short** is bold
        assert not answer.query("MarkdownBlock")  # nothing mounted while the answer streams
        assert stream.region.height == answer.reserve_rows  # the box sized ahead did not change
        engine.gate.set()
        await settle(pilot, app)
        assert answer.query("MarkdownBlock") and stream.region.height == 0  # the whole answer went to the Markdown
        assert answer.text == SCRIPT + " "


@aio
async def test_streaming_answer_is_drawn_again_when_the_theme_changes(tmp_path):
    engine = FakeEngine(hold_after=6)
    app = make_app(engine, tmp_path, theme="textual-dark")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        answer = await send_until_held(pilot, app, engine, "tell me")
        stream = answer.stream
        await until(pilot, lambda: stream.text.endswith("first "))
        dark = stream.render_line(0)
        app.theme = "textual-light"
        await pilot.pause()
        stream.show(stream.text)  # what the next frame does
        light = stream.render_line(0)
        assert light.text == dark.text and list(light)[0].style != list(dark)[0].style
        assert list(light)[0].style.bgcolor == stream.rich_style.bgcolor  # drawn in the new theme
        engine.gate.set()
        await settle(pilot, app)


@aio
async def test_request_starts_after_the_turn_is_painted_when_no_core_is_spare(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # and the fake engine runs 2 threads
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    heights = []  # the answer box's height when the request starts: 0 until it is laid out
    engine.on_request = lambda: heights.append(app.chat_screen.query_one(AssistantMessage).region.height)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "hi")
    assert heights and heights[0] > 0


@aio
async def test_new_chat_clears_transcript_and_kv_cache(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "first chat")
        first_id = app.controller.session.conversation_id
        await pilot.press("ctrl+n")
        await settle(pilot, app)
        assert engine.resets == 1 and engine.kv_cache_tokens == 0
        assert not app.chat_screen.query(AssistantMessage)
        assert any("New chat" in n for n in notes(app))
        assert app.controller.session.chat.messages == [] and app.controller.session.conversation_id is None
        assert "0/4096 tok" in stats_text(app, "ctx")
        await send(pilot, app, "second chat")
        assert app.controller.session.conversation_id != first_id
    assert len(app.controller.store.list_conversations()) == 2


@aio
async def test_settings_screen_applies_and_validates(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path, settings=ChatSettings(system="Be terse."))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("f2")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, SettingsScreen)
        assert dialog.query_one("#set-system").value == "Be terse."
        dialog.query_one("#set-top-p").value = "1.5"
        await pilot.click("#settings-save")
        await pilot.pause()
        assert app.screen is dialog and "top_p" in str(dialog.query_one("#settings-error").render())
        dialog.query_one("#set-top-p").value = "0.5"
        dialog.query_one("#set-temperature").value = "0.2"
        dialog.query_one("#set-max-tokens").value = "5"
        dialog.query_one("#set-system").value = "You are a pirate."
        await pilot.press("ctrl+s")
        await settle(pilot, app)
        assert not isinstance(app.screen, SettingsScreen)
        assert app.controller.settings == ChatSettings("You are a pirate.", 0.2, 0.5, 5)
        await send(pilot, app, "hi")
        call = engine.calls[-1]
        assert (call["temperature"], call["top_p"], call["max_tokens"]) == (0.2, 0.5, 5)
        assert app.controller.session.chat.messages[0] == {"role": "system", "content": "You are a pirate."}
        answer = app.chat_screen.query_one(AssistantMessage)
        assert str(answer.query_one(".footer").render()).endswith("length")
        # Escape closes without changing anything
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.controller.settings.max_tokens == 5


@aio
async def test_context_full_warns_then_drops_oldest_turns(tmp_path):
    # turn 1: prompt 10 + 14 answer tokens; with max_tokens 20 the next one cannot fit in 42
    engine = FakeEngine(n_ctx=42)
    app = make_app(engine, tmp_path, settings=ChatSettings(system="Be brief.", max_tokens=20))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "first question here")
        assert app.chat_screen.query_one(StatsPanel).context_level == "warn"
        assert any("Context nearly full" in n for n in notes(app))
        await send(pilot, app, "second question here")
        assert any("dropped the oldest 1 turn" in n for n in notes(app))
        first = app.controller.turns[0]
        assert first.dropped and first.user.has_class("dropped") and first.assistant.has_class("dropped")
        roles = [m["role"] for m in app.controller.session.chat.messages]
        assert roles == ["system", "user", "assistant"]  # system kept, oldest pair gone
        assert app.chat_screen.query(AssistantMessage)[1].text.strip() == SCRIPT.strip()
    conv = app.controller.store.load(app.controller.store.last_conversation_id())
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "note", "assistant"]


@aio
async def test_turn_that_can_never_fit_is_refused_on_screen(tmp_path):
    engine = FakeEngine(n_ctx=30)
    app = make_app(engine, tmp_path, settings=ChatSettings(max_tokens=25))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "a b c d e f g h i j")
        answer = app.chat_screen.query_one(AssistantMessage)
        assert answer.has_class("failed")
        assert any("nothing left to drop" in n for n in notes(app))
        assert app.controller.session.chat.messages == []
        assert "ready" in text_of(app, "#status")


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
