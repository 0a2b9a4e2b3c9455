"""Pilot helpers for the chat app's tests: an app on a fake engine, and waits that fail instead of hanging."""

from __future__ import annotations

import asyncio

from ondevice.tui.app import ChatApp
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.stats import StatsPanel
from ondevice.tui.widgets.transcript import AssistantMessage, Note

from tests.tui_fakes import FakeEngine

FIXED_MEMORY = lambda: (123 << 20, 4 << 30, 16 << 30)  # noqa: E731 - a fixed memory reading, passed as the probe callback


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


def tiny_engine(tiny_model):
    """The tiny synthetic model loaded with a fixed roofline predictor (figures that do not depend on the machine)."""
    import ondevice
    from ondevice.roofline import Calibration, Predictor

    predictor = Predictor(ondevice.inspect(tiny_model), Calibration(backend="CPU", ceiling_gbs=20.0, t0_s=0.0002))
    return ondevice.load(tiny_model, n_ctx=512, n_threads=1, predictor=predictor)


async def close_when_idle(engine, tries: int = 600) -> None:
    """Close an engine once its generation has ended (a failed test leaves a cancelled answer finishing its step)."""
    for _ in range(tries):
        if not engine.busy:
            break
        await asyncio.sleep(0.05)
    engine.close()
