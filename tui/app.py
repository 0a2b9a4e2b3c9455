"""The `ondevice chat` app: key bindings, screens, and the ChatController it builds from its arguments.

The engine comes from a factory (a zero-argument callable), so tests can pass a scripted
fake and the benchmark an engine it already holds. The state (engine, session, settings,
turns, busy/idle) lives in `app.controller` (tui/controller.py), which the main screen is
given; the app never reads the screen's members: its actions call the screen's commands
(`new_chat`, `apply_settings`, `open_conversation`), and it hears the model's name from the
screen's ModelNamed message. The app never closes an engine it did not get from the
factory's call; the caller closes `app.controller.engine` after `run()`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from ondevice.tui.controller import ChatController, EngineFactory, process_memory
from ondevice.tui.screens.chat import ChatScreen
from ondevice.tui.screens.help import HelpScreen
from ondevice.tui.screens.history import HistoryScreen
from ondevice.tui.screens.messages import ModelNamed
from ondevice.tui.screens.settings import SettingsScreen
from textual.app import App
from textual.binding import Binding

from ondevice.core.errors import OndeviceError

__all__ = ["ChatApp", "EngineFactory", "terminal_theme", "process_memory"]

GIL_SWITCH_S = 0.0005  # sys.setswitchinterval while the app runs (the default is 0.005)


def terminal_theme(env: Mapping[str, str] | None = None) -> str:
    """Follow the terminal: its own ANSI palette, light or dark by COLORFGBG when it says."""
    env = os.environ if env is None else env
    bg = env.get("COLORFGBG", "").rsplit(";", 1)[-1]
    return "ansi-light" if bg in ("7", "15") else "ansi-dark"


class ChatApp(App):
    CSS_PATH = "ondevice.tcss"
    TITLE = "ondevice chat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Keys"),
        Binding("f2", "settings", "Settings"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "history", "History"),
        Binding("ctrl+s", "export", "Export"),
    ]

    def __init__(self, engine_factory: EngineFactory, *, theme: str | None = None, **controller_args: Any):
        """controller_args: ChatController's (settings, store, model_label, resume, extra_sampling,
        memory_reader, export_dir); the app keeps only the theme and the bindings."""
        super().__init__()
        self.controller = ChatController(engine_factory, **controller_args)
        self.theme = theme or terminal_theme()
        self.sub_title = self.controller.model_label

    def on_mount(self) -> None:
        # The decode thread needs the GIL back after each llama_decode; with the default 5 ms
        # switch interval a busy UI frame can hold it that long, twice per token. 0.5 ms keeps
        # that wait short. Restored when the app ends.
        self._switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval_s, GIL_SWITCH_S))

    def on_unmount(self) -> None:
        sys.setswitchinterval(getattr(self, "_switch_interval_s", sys.getswitchinterval()))

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen(self.controller)

    @property
    def chat_screen(self) -> ChatScreen:
        """The main screen (the bottom of the stack), for its commands."""
        screen = self.screen_stack[0]
        assert isinstance(screen, ChatScreen)
        return screen

    def on_chat_screen_model_named(self, message: ModelNamed) -> None:
        self.sub_title = message.name

    # -- actions -----------------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_settings(self) -> None:
        if not isinstance(self.screen, SettingsScreen):
            self.push_screen(SettingsScreen(self.controller.settings), callback=self.chat_screen.apply_settings)

    async def action_new_chat(self) -> None:
        await self.chat_screen.new_chat()

    def action_history(self) -> None:
        store = self.controller.store
        if store is None:
            self.notify("History is off (--no-history).", severity="warning")
            return
        self.push_screen(HistoryScreen(store.list_conversations()), callback=self.chat_screen.open_conversation)

    def action_export(self) -> None:
        try:
            md = self.controller.export()
        except OndeviceError as exc:
            self.notify(str(exc), severity="error")
            return
        if md is None:
            self.notify("Nothing to export yet.", severity="warning")
            return
        self.notify(f"Exported to {md.with_suffix('')}.md and .json", timeout=8)

    async def action_quit(self) -> None:
        self.controller.cancel()
        self.exit()
