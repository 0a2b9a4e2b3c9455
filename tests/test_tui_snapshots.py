"""Snapshot tests (pytest-textual-snapshot) of the main, settings and keys screens.

A scripted fake engine and fixed memory figures make every frame deterministic.
Update after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from ondevice.tui.app import ChatApp
from ondevice.tui.session import ChatSettings

from tests.tui_fakes import FakeEngine
from tests.tui_pilot import FIXED_MEMORY, settle


def scripted_app() -> ChatApp:
    engine = FakeEngine()
    return ChatApp(
        lambda: engine,
        settings=ChatSettings(system="You are terse.", temperature=0.7),
        model_label="fake-model-1B.gguf",
        memory_reader=FIXED_MEMORY,
        theme="ansi-dark",
    )


async def steady(pilot) -> None:
    """Loaded, and the input's cursor not blinking (a blink phase would differ run to run)."""
    await settle(pilot, pilot.app)
    for widget in pilot.app.query("Input"):
        widget.cursor_blink = False


async def one_answer(pilot) -> None:
    app = pilot.app
    await steady(pilot)
    app.chat_screen.query_one("#prompt").value = "Give me two points."
    await pilot.press("enter")
    await settle(pilot, app)
    await pilot.pause(0.1)


def test_main_screen_after_an_answer_80x24(snap_compare):
    assert snap_compare(scripted_app(), terminal_size=(80, 24), run_before=one_answer)


def test_main_screen_after_an_answer_120x40(snap_compare):
    assert snap_compare(scripted_app(), terminal_size=(120, 40), run_before=one_answer)


def test_settings_screen(snap_compare):
    async def open_settings(pilot) -> None:
        await steady(pilot)
        await pilot.press("f2")
        await pilot.pause(0.1)
        for widget in pilot.app.screen.query("Input"):
            widget.cursor_blink = False
        await pilot.pause()

    assert snap_compare(scripted_app(), terminal_size=(80, 24), run_before=open_settings)


def test_keys_screen(snap_compare):
    async def open_keys(pilot) -> None:
        await steady(pilot)
        await pilot.press("f1")
        await pilot.pause(0.1)

    assert snap_compare(scripted_app(), terminal_size=(80, 24), run_before=open_keys)
