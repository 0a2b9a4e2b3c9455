"""Pilot tests of the chat app on a scripted fake engine (deterministic, no llama.cpp): turns,
streaming, cancel, settings, the context filling up."""

from __future__ import annotations

from ondevice.tui.screens.settings import SettingsScreen
from ondevice.tui.session import ChatSettings
from ondevice.tui.widgets.stats import StatsPanel
from ondevice.tui.widgets.transcript import AssistantMessage

from tests.tui_fakes import SCRIPT, FakeEngine, aio
from tests.tui_pilot import make_app, notes, send, send_until_held, settle, stats_text, text_of, until


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
