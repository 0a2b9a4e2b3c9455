"""Pilot flows on the real engine: a tiny synthetic model (and the default model, end to end)."""

from __future__ import annotations

import asyncio

import pytest
from ondevice.tui.app import ChatApp
from ondevice.tui.session import ChatSettings
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.transcript import AssistantMessage

import ondevice
from tests.tui_fakes import Gated, aio
from tests.tui_pilot import FIXED_MEMORY, close_when_idle, notes, send, settle, stats_text, tiny_engine

GREEDY = ChatSettings(system="You are a test.", temperature=0.0, top_p=1.0, max_tokens=32)


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = tiny_engine(tiny_model)
    yield eng
    eng.close()


def real_app(engine, tmp_path, settings=GREEDY) -> ChatApp:
    engine.reset()
    return ChatApp(
        lambda: engine,
        settings=settings,
        store=HistoryStore(tmp_path / "h.sqlite3"),
        model_label="tiny",
        extra_sampling={"ignore_eos": True},
        memory_reader=FIXED_MEMORY,
    )


@aio
async def test_send_fills_stats_from_the_real_engine(engine, tmp_path):
    app = real_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "hello world")
        turn = app.controller.turns[0]
        g = turn.tracker.final
        assert g.finish_reason == "length" and g.timings.output_tokens == 32
        assert len(turn.tracker.itl_s) == 31
        assert turn.assistant.text == g.text or turn.assistant.text == g.text.removeprefix(" ")
        stats = turn.tracker.stats()
        assert stats.decode_tok_s == pytest.approx(g.timings.decode_tok_s)
        assert stats.ceiling_tok_s and stats.predicted_tok_s and stats.efficiency
        for label in ("TTFT", "decode", "ceiling", "predicted"):
            assert label in stats_text(app, "live")
        assert "–" not in stats_text(app, "live")
        assert f"{engine.kv_cache_tokens}/512 tok" in stats_text(app, "ctx")
        footer = str(turn.assistant.query_one(".footer").render())
        assert "32 tok" in footer and footer.endswith("length")
        assert "CPU" in stats_text(app, "card")
        await send(pilot, app, "again")
        assert app.controller.turns[1].tracker.final.cached_prompt_tokens > 0
    saved = app.controller.store.load(app.controller.store.last_conversation_id()).messages
    assert saved[1].stats["timings"]["output_tokens"] == 32


@aio
async def test_message_and_system_prompt_with_invalid_utf8(engine, tmp_path):
    """Lone surrogates (bytes that were not UTF-8) become U+FFFD: the turn runs and the history is saved."""
    settings = ChatSettings(system="Sys \udcff.", temperature=0.0, max_tokens=4)
    app = real_app(engine, tmp_path, settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "caf\udcc3\udca9 \udcff \ud800!")
        g = app.controller.turns[0].tracker.final
        assert g is not None and g.timings.output_tokens == 4
        assert not [t for t in notes(app) if "rror" in t or "not saved" in t]
    saved = app.controller.store.load(app.controller.store.last_conversation_id())
    assert saved.system == "Sys \ufffd." and saved.messages[0].content == "café \ufffd \ufffd!"


@aio
async def test_escape_cancels_a_real_generation(engine, tmp_path):
    gated = Gated(engine, hold_after=5)
    app = real_app(gated, tmp_path, ChatSettings(temperature=0.0, max_tokens=200))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        app.chat_screen.query_one("#prompt").value = "go on"
        await pilot.press("enter")
        await asyncio.get_running_loop().run_in_executor(None, gated.held.wait, 10)
        await pilot.press("escape")
        gated.gate.set()
        await settle(pilot, app)
        turn = app.controller.turns[0]
        assert turn.tracker.final.finish_reason == "cancelled"
        assert 5 <= turn.tracker.final.timings.output_tokens < 200
        assert turn.assistant.has_class("cancelled")
        assert app.controller.session.chat.messages[-1]["role"] == "assistant"  # the partial answer stays
        gated.hold_after = -1
        await send(pilot, app, "next")
        assert app.controller.turns[1].tracker.final.finish_reason == "length"


@aio
async def test_new_chat_clears_the_real_kv_cache(engine, tmp_path):
    app = real_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await send(pilot, app, "fill the cache")
        assert engine.kv_cache_tokens > 32
        await pilot.press("ctrl+n")
        await settle(pilot, app)
        assert engine.kv_cache_tokens == 0
        assert app.controller.session.chat.messages == [{"role": "system", "content": "You are a test."}]
        await send(pilot, app, "fresh")
        assert app.controller.turns[0].tracker.final.cached_prompt_tokens == 0


@aio
async def test_settings_reach_the_real_engine(engine, tmp_path):
    app = real_app(engine, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#set-max-tokens").value = "7"
        app.screen.query_one("#set-system").value = "Answer in French."
        await pilot.press("ctrl+s")
        await settle(pilot, app)
        await send(pilot, app, "bonjour")
        g = app.controller.turns[0].tracker.final
        assert g.timings.output_tokens == 7 and g.finish_reason == "length"
        assert app.controller.session.chat.messages[0] == {"role": "system", "content": "Answer in French."}


@aio
async def test_context_full_drops_oldest_turns_on_the_real_engine(tiny_model, tmp_path):
    small = ondevice.load(tiny_model, n_ctx=256, n_threads=1, predictor=None)
    try:
        app = real_app(small, tmp_path, ChatSettings(system="Sys.", temperature=0.0, max_tokens=40))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            for n in range(8):
                await send(pilot, app, f"question {n}")
                if any("dropped the oldest" in t for t in notes(app)):
                    break
            assert any("Context nearly full" in t for t in notes(app))
            assert any("dropped the oldest" in t for t in notes(app))
            assert app.controller.turns[0].dropped
            last = app.controller.turns[-1].tracker.final
            assert last.finish_reason == "length" and last.timings.output_tokens == 40
            assert app.controller.session.chat.messages[0] == {"role": "system", "content": "Sys."}
            assert small.kv_cache_tokens <= small.n_ctx  # llama.cpp rounds n_ctx up (here to 256)
    finally:
        small.close()


@pytest.mark.default_model
@aio
async def test_default_model_answers_in_the_tui(default_model, tmp_path):
    eng = ondevice.load(default_model, n_ctx=1024)
    try:
        settings = ChatSettings(temperature=0.0, top_p=1.0, max_tokens=24)
        app = ChatApp(
            lambda: eng, settings=settings, store=HistoryStore(tmp_path / "h.sqlite3"), memory_reader=FIXED_MEMORY
        )
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app, timeout_s=60)
            await send(pilot, app, "What is the capital of France?", timeout_s=300)  # a busy 2-core box is slow
            answer = app.chat_screen.query_one(AssistantMessage)
            assert "Paris" in answer.text
            assert app.controller.turns[0].tracker.final.timings.ttft_s > 0
    finally:
        await close_when_idle(eng)
