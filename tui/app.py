"""The `ondevice chat` app: loads the engine in a worker, owns the session and the history.

The engine comes from a factory (a zero-argument callable), so tests can pass a scripted
fake and the benchmark an engine it already holds. The app never closes an engine it did
not get from the factory's call; the caller closes `app.engine` after `run()`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import psutil
from textual import work
from textual.app import App
from textual.binding import Binding

from ondevice import paths
from ondevice.errors import OndeviceError
from ondevice.tui.screens.chat import ChatScreen
from ondevice.tui.screens.help import HelpScreen
from ondevice.tui.screens.history import HistoryScreen
from ondevice.tui.screens.settings import SettingsScreen
from ondevice.tui.session import ChatSession, ChatSettings
from ondevice.tui.store import Conversation, HistoryStore
from ondevice.tui.widgets.stats import StatsPanel, model_card_lines

__all__ = ["ChatApp", "EngineFactory", "terminal_theme", "process_memory"]

log = logging.getLogger(__name__)
EngineFactory = Callable[[], Any]
GIL_SWITCH_S = 0.0005  # sys.setswitchinterval while the app runs (the default is 0.005)


def process_memory() -> tuple[int | None, int | None, int | None]:
    """(process RSS, system memory in use, system memory total), bytes; None when unknown."""
    try:
        vm = psutil.virtual_memory()
        return psutil.Process().memory_info().rss, vm.total - vm.available, vm.total
    except (psutil.Error, OSError):
        return None, None, None


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

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        settings: ChatSettings | None = None,
        store: HistoryStore | None = None,
        model_label: str = "model",
        resume: int | None = None,
        extra_sampling: Mapping[str, Any] | None = None,
        theme: str | None = None,
        export_dir: Path | None = None,
        memory_reader: Callable[[], tuple[int | None, int | None, int | None]] = process_memory,
    ):
        super().__init__()
        self.engine_factory = engine_factory
        self.settings = (settings or ChatSettings()).validated()
        self.store = store
        self.model_label = model_label
        self.resume = resume  # conversation id to reopen once the model is loaded
        self.extra_sampling = dict(extra_sampling or {})
        self.export_dir = export_dir
        self.memory_reader = memory_reader  # polled once a second for the stats panel
        self.engine: Any = None  # set when the load worker finishes
        self.session: ChatSession | None = None
        self.load_error: str | None = None
        self.theme = theme or terminal_theme()
        self.sub_title = model_label

    def on_mount(self) -> None:
        # The decode thread needs the GIL back after each llama_decode; with the default 5 ms
        # switch interval a busy UI frame can hold it that long, twice per token. 0.5 ms keeps
        # that wait short. Restored when the app ends.
        self._switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval_s, GIL_SWITCH_S))

    def on_unmount(self) -> None:
        sys.setswitchinterval(getattr(self, "_switch_interval_s", sys.getswitchinterval()))

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen()

    @property
    def chat_screen(self) -> ChatScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, ChatScreen)
        return screen

    @property
    def generating(self) -> bool:
        """True while an answer streams, a message is queued or the engine is busy."""
        s = self.chat_screen
        return s.turn is not None or bool(s.queue) or bool(s.busy_reason)

    # -- loading -----------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Called by the chat screen once it is mounted."""
        screen = self.chat_screen
        screen.busy_reason = "loading"
        screen.set_title(self.model_label)
        screen.set_status(f"loading {self.model_label}… (you can type meanwhile)", "busy")
        self._load()

    @work(thread=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        engine = session = conv = None
        error = None
        try:
            engine = self.engine_factory()
            session = ChatSession(engine, self.settings, self.store, self.model_label, self.extra_sampling)
            if self.resume is not None and self.store is not None:
                conv = self.store.load(self.resume)
                session.restore(conv)
                self.settings = session.settings
        except OndeviceError as exc:
            error = str(exc)
        except Exception as exc:  # shown on screen, never a traceback
            log.exception("model load failed")
            error = f"{type(exc).__name__}: {exc}"
        if not self.is_running:
            if engine is not None:
                engine.close()
            return
        self.call_from_thread(self._on_loaded, engine, session, conv, error)

    async def _on_loaded(self, engine: Any, session: ChatSession | None, conv: Conversation | None, error: str | None) -> None:
        screen = self.chat_screen
        screen.busy_reason = None
        if error is not None:
            self.load_error = error
            if engine is not None and session is None:
                self.engine = engine  # loaded, but the chat could not start; close it on exit
            screen.set_status(f"model failed to load: {error}", "error")
            await screen.note(f"Could not load {self.model_label}: {error}", "error")
            for _, widget in screen.queue:
                widget.add_class("failed")
            screen.queue.clear()
            self.query_one(StatsPanel).show_model([self.model_label, "not loaded"])
            return
        self.engine, self.session = engine, session
        info = engine.info
        self.sub_title = info.spec.name or self.model_label
        screen.set_title(self.sub_title)
        self.query_one(StatsPanel).show_model(model_card_lines(info))
        if conv is not None:
            await screen.show_conversation(conv)
        if engine.predictor is None:
            await screen.note("No probe results for this machine yet: run `ondevice probe` to see the predicted ceiling.")
        screen.show_context()
        screen.idle_status()
        await screen.send_queued()

    def status_line(self) -> str:
        """The idle status: load time, backend, context."""
        info = self.engine.info
        return f"ready · loaded in {info.load_s:.2f} s · {info.backend} · ctx {self.engine.n_ctx}"

    # -- engine tasks (new chat, restore, settings) ----------------------------------------

    def _run_engine_task(self, what: str, fn: Callable[[], None], then: Callable[[str | None], Any] | None = None) -> None:
        screen = self.chat_screen
        screen.busy_reason = what
        screen.set_status(f"{what}…", "busy")
        self._engine_task(fn, then)

    @work(thread=True, group="engine-task", exit_on_error=False)
    def _engine_task(self, fn: Callable[[], None], then: Callable[[str | None], Any] | None) -> None:
        error = None
        try:
            fn()
        except OndeviceError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("engine task failed")
            error = f"{type(exc).__name__}: {exc}"
        if self.is_running:
            self.call_from_thread(self._engine_task_done, then, error)

    async def _engine_task_done(self, then: Callable[[str | None], Any] | None, error: str | None) -> None:
        screen = self.chat_screen
        screen.busy_reason = None
        if then is not None:
            result = then(error)
            if hasattr(result, "__await__"):
                await result
        elif error:
            await screen.note(error, "error")
        screen.show_context()
        screen.idle_status()
        await screen.send_queued()

    # -- actions -----------------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_settings(self) -> None:
        if not isinstance(self.screen, SettingsScreen):
            self.push_screen(SettingsScreen(self.settings), callback=self._apply_settings)

    def _apply_settings(self, settings: ChatSettings | None) -> None:
        if settings is None or settings == self.settings:
            return
        self.settings = settings
        if self.session is None:
            return
        session = self.session

        async def done(error: str | None) -> None:
            text = error or f"Settings: temperature {settings.temperature:g}, top p {settings.top_p:g}, max tokens {settings.max_tokens}"
            await self.chat_screen.note(text + (f", system prompt “{settings.system}”" if settings.system and not error else ""))

        self._run_engine_task("applying settings", lambda: session.apply_settings(settings), done)

    async def action_new_chat(self) -> None:
        screen = self.chat_screen
        if self.session is None:
            return
        await screen.clear()
        session = self.session

        async def done(error: str | None) -> None:
            await screen.note(error or "New chat: the KV cache is cleared.", "error" if error else "info")

        self._run_engine_task("starting a new chat", session.new_chat, done)

    def action_history(self) -> None:
        if self.store is None:
            self.notify("History is off (--no-history).", severity="warning")
            return
        self.push_screen(HistoryScreen(self.store.list_conversations()), callback=self._open_conversation)

    async def _open_conversation(self, conversation_id: int | None) -> None:
        if conversation_id is None or self.session is None or self.store is None:
            return
        conv = self.store.load(conversation_id)
        screen = self.chat_screen
        await screen.clear()
        await screen.show_conversation(conv)
        session = self.session

        def restore() -> None:
            session.restore(conv)
            self.settings = session.settings

        self._run_engine_task("reopening the conversation", restore)

    def action_export(self) -> None:
        cid = self.session.conversation_id if self.session is not None else None
        if self.store is None or cid is None:
            self.notify("Nothing to export yet.", severity="warning")
            return
        folder = self.export_dir or paths.data_dir() / "exports"
        stem = f"chat-{cid}-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            md = self.store.export(cid, folder / f"{stem}.md")
            self.store.export(cid, folder / f"{stem}.json")
        except OndeviceError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"Exported to {md.with_suffix('')}.md and .json", timeout=8)

    async def action_quit(self) -> None:
        screen = self.chat_screen
        if screen.turn is not None:
            screen.turn.cancel.set()
        self.exit()
