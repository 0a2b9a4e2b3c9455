"""The main screen: transcript and input on the left, the stats panel on the right.

Generation runs in a thread worker that only pushes token events into a LiveFeed; a
timer drains it (at most 10 frames a second, fewer when the UI thread would spend more
than its CPU budget), appends the new text in one batch (finished blocks drawn as
Markdown, the block being written as plain text, in a box sized ahead: no layout pass)
and refreshes the stats. A tick with no new token repaints nothing. Engine calls never
run on the UI thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Input, Static

from ondevice.errors import OndeviceError
from ondevice.textclean import clean_text
from ondevice.tui.live import LiveFeed, LiveTracker, context_level, generation_stats
from ondevice.tui.session import ChatSession, dropped_note
from ondevice.tui.store import Conversation, stats_footer
from ondevice.tui.widgets.stats import StatsPanel
from ondevice.tui.widgets.transcript import AssistantMessage, Note, Transcript, UserMessage

if TYPE_CHECKING:
    from ondevice.tui.app import ChatApp

__all__ = ["ChatScreen", "TICK_S", "no_spare_core", "ui_cpu_budget"]

log = logging.getLogger(__name__)
TICK_S = 1 / 10  # timer period while tokens stream: at most 10 frames a second (cap ~20 Hz)
MAX_FRAME_S = 0.5  # ... and at least 2 frames a second, however slow the machine
UI_CPU_BUDGET = 0.04  # share of one core the UI thread may spend while tokens stream ...
UI_CPU_BUDGET_NO_SPARE_CORE = 0.015  # ... when the engine's threads take every core: each slice
# the UI takes stalls one decode thread, and the others wait for it at the next barrier
MEMORY_TICK_S = 2.0  # RSS / system memory refresh period
# One line each instead of Textual's Header and Footer: fewer widgets make every frame and
# every layout pass cheaper while tokens stream.
KEYS_BAR = "[b]esc[/] cancel  [b]^n[/] new  [b]f2[/] settings  [b]^o[/] history  [b]^s[/] export  [b]f1[/] keys  [b]^q[/] quit"


def no_spare_core(engine_threads: int | None, cpu_count: int | None) -> bool:
    """The engine's threads take every core (unknown counts: assume a core is left)."""
    return bool(engine_threads and cpu_count and engine_threads >= cpu_count)


def ui_cpu_budget(engine_threads: int | None, cpu_count: int | None) -> float:
    """The UI thread's CPU share while tokens stream: less when no core is left to it."""
    return UI_CPU_BUDGET_NO_SPARE_CORE if no_spare_core(engine_threads, cpu_count) else UI_CPU_BUDGET


@dataclass
class Turn:
    """One user message and the answer being streamed for it."""

    text: str
    user: UserMessage
    assistant: AssistantMessage
    tracker: LiveTracker
    feed: LiveFeed = field(default_factory=LiveFeed)
    cancel: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False  # no longer in the model's context
    ui_budget: float = UI_CPU_BUDGET  # share of a core the UI may spend on this turn's frames (ui_cpu_budget)
    frame_cpu_s: float | None = None  # UI thread CPU time (thread_time) at the last frame
    following: bool = True  # the view follows the text (until the user scrolls up)
    scrolled_y: float | None = None  # the transcript's scroll offset after the last follow


class ChatScreen(Screen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=True)]

    def __init__(self) -> None:
        super().__init__()
        self.turn: Turn | None = None  # the turn streaming now
        self.turns: list[Turn] = []  # turns shown, oldest first
        self.queue: list[tuple[str, UserMessage]] = []  # sent while busy; go out in order
        self.busy_reason: str | None = None  # "loading", "resetting", ...: engine not free for a turn
        self._ctx_level = "ok"
        self._last_memory_s = 0.0  # perf_counter() of the last memory refresh

    @property
    def chat_app(self) -> "ChatApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        # Laid out by the screen's grid (ondevice.tcss), without nested containers: every
        # widget on screen is drawn again on every frame.
        yield Static("◆ ondevice chat", id="title", markup=False)
        yield Transcript(id="transcript")
        yield StatsPanel(id="stats")
        yield Static("", id="status", markup=False)
        yield Input(placeholder="Message — Enter sends, F1 keys", id="prompt")
        yield Static(KEYS_BAR, id="keys")

    def on_mount(self) -> None:
        self._panel = self.query_one(StatsPanel)
        self._transcript = self.query_one(Transcript)
        prompt = self.query_one("#prompt", Input)
        prompt.cursor_blink = False  # a blinking cursor repaints twice a second, also while tokens stream
        prompt.focus()
        self._tick: Timer | None = None  # one-shot, re-armed after each frame (see _on_tick)
        self.set_interval(MEMORY_TICK_S, self._memory_tick)
        self.refresh_memory()
        self.chat_app.start_loading()

    def on_unmount(self) -> None:
        """The app is going away: stop a running answer so its thread ends at the next token."""
        if self.turn is not None:
            self.turn.cancel.set()

    # -- status ------------------------------------------------------------------------------

    def set_title(self, model: str) -> None:
        self.query_one("#title", Static).update(f"◆ ondevice chat — {model}", layout=False)

    def set_status(self, text: str, kind: str = "info") -> None:
        status = self.query_one("#status", Static)
        for name in ("info", "busy", "error"):
            status.set_class(name == kind, f"status-{name}")
        status.update(text, layout=False)  # one line, always: no layout pass needed

    def idle_status(self) -> None:
        if self.chat_app.session is None:
            return
        queued = f" · {len(self.queue)} queued" if self.queue else ""
        self.set_status(self.chat_app.status_line() + queued)

    async def note(self, text: str, kind: str = "info", before: Any = None) -> None:
        transcript = self._transcript
        if before is not None and before.is_attached:
            await transcript.mount(Note(text, kind=kind), before=before)
        else:
            await transcript.add_note(text, kind)

    # -- sending -----------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = clean_text(event.value).strip()  # lone surrogates (a paste of non-UTF-8 bytes) become U+FFFD
        event.input.value = ""
        if text:
            await self.submit(text)

    async def submit(self, text: str) -> None:
        """Send now if the engine is free, else show the message as queued."""
        if self.chat_app.session is None or self.turn is not None or self.busy_reason or self.queue:
            if self.chat_app.load_error is not None:
                await self.note(f"No model loaded: {self.chat_app.load_error}", "error")
                return
            widget = await self._transcript.add_user(text, queued=True)
            self.queue.append((text, widget))
            self.set_status(f"{len(self.queue)} queued: will be sent when the model is free", "busy")
            return
        await self._start_turn(text, None)

    async def send_queued(self) -> None:
        if self.queue and self.turn is None and not self.busy_reason and self.chat_app.session is not None:
            text, widget = self.queue.pop(0)
            await self._start_turn(text, widget)

    async def _start_turn(self, text: str, user: UserMessage | None) -> None:
        transcript = self._transcript
        app = self.chat_app
        queued, user = user is not None, user or UserMessage(text)
        assistant = AssistantMessage(reserve_rows=transcript.reserve_for(app.settings.max_tokens))
        threads, cores = getattr(getattr(app.engine, "info", None), "n_threads", None), os.cpu_count()
        turn = Turn(text, user, assistant, LiveTracker(app.engine.predictor, app.engine.kv_cache_tokens),
                    ui_budget=ui_cpu_budget(threads, cores))
        self.turn = turn  # from now on the app is busy (a new message queues), also while the widgets mount
        self.turns.append(turn)
        if queued:
            user.remove_class("queued")
            await transcript.mount(assistant)
        else:
            await transcript.mount_all([user, assistant])  # one layout pass for both
        if turn is not self.turn:  # a new chat or a restore came while they mounted
            return
        transcript.scroll_to_widget(user, animate=False, immediate=True, top=True)
        transcript.anchor(False)  # the view follows the text by hand (Transcript.follow)
        self.set_status("generating · Esc cancels", "busy")
        self._arm_tick(TICK_S)
        if no_spare_core(threads, cores):
            # The request starts once the new messages are on screen: laying them out and
            # painting them takes the UI thread 100-300 ms on a small machine, which would
            # otherwise take a core from prefill, slow it, and count in this message's TTFT.
            self.call_after_refresh(self._begin, turn, app.session)
        else:  # a core is left for the UI: painting and prefill run side by side
            self._begin(turn, app.session)

    def _begin(self, turn: Turn, session: ChatSession) -> None:
        if turn is self.turn:  # not replaced by a new chat or a restore meanwhile
            self._generate(turn, session)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn, session: ChatSession) -> None:
        result, error = None, None
        try:
            result = session.run_turn(
                turn.text, turn.cancel, turn.feed.push, on_dropped=lambda n: self._from_thread(self._on_dropped, turn, n)
            )
        except OndeviceError as exc:
            error = str(exc)
        except Exception as exc:  # shown on screen, never a traceback
            log.exception("generation failed")
            error = f"{type(exc).__name__}: {exc}"
        self._from_thread(self._finish_turn, turn, result, error)

    def _from_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """call_from_thread, unless the app is already gone (quit while generating)."""
        if not self.app.is_running:
            return
        try:
            self.app.call_from_thread(fn, *args)
        except Exception:  # the screen went away while the callback ran
            log.debug("UI update after exit dropped", exc_info=True)

    # -- the timer ---------------------------------------------------------------------------

    def _arm_tick(self, delay_s: float) -> None:
        """One timer at a time, one-shot: the UI thread wakes only when a frame is due."""
        if self._tick is not None:
            self._tick.stop()
        self._tick = self.set_timer(delay_s, self._on_tick)

    def _stop_tick(self) -> None:
        if self._tick is not None:
            self._tick.stop()
            self._tick = None

    def _on_tick(self) -> None:
        """One frame: new text, then the stats. Frames are paced so that the UI thread's CPU
        (the frame's own rendering included) stays within its budget (ui_cpu_budget): on a
        fast machine that is the full 10 Hz, on a slow or busy one fewer frames."""
        self._tick = None
        turn = self.turn
        if turn is None:
            return
        events = turn.feed.drain()
        if not events:  # nothing new: no repaint at all; look again in a tick
            self._arm_tick(TICK_S)
            return
        cpu = time.thread_time()
        spent = cpu - turn.frame_cpu_s if turn.frame_cpu_s is not None else 0.0
        turn.frame_cpu_s = cpu
        turn.assistant.append(turn.tracker.add(events))
        self._follow(turn)
        self.show_turn_stats(turn)
        self._arm_tick(min(MAX_FRAME_S, max(TICK_S, spent / turn.ui_budget)))

    def _follow(self, turn: Turn) -> None:
        if turn.following:
            stream = turn.assistant.stream
            turn.scrolled_y = self._transcript.follow(stream, max(0, stream.row_count - 1), turn.scrolled_y)
            turn.following = turn.scrolled_y is not None

    def show_turn_stats(self, turn: Turn) -> None:
        panel = self._panel
        stats = turn.tracker.stats()
        panel.show_live(stats, turn.tracker.itl_s)
        self.show_context(stats.n_ctx_used)
        if time.perf_counter() - self._last_memory_s >= MEMORY_TICK_S:
            self.refresh_memory()

    def show_context(self, used: int | None = None) -> str:
        engine = self.chat_app.engine
        if engine is None:
            return "ok"
        used = engine.kv_cache_tokens if used is None else used
        level = context_level(used, engine.n_ctx, reserve=self.chat_app.settings.max_tokens)
        spec = engine.info.spec
        kv_bytes = spec.kv_read_bytes(used) if spec.kv_bytes_per_token_by_layer else None
        self._panel.show_context(used, engine.n_ctx, kv_bytes, level)
        return level

    def _memory_tick(self) -> None:
        if self.turn is None:  # while tokens stream, frames refresh it (no extra repaint)
            self.refresh_memory()

    def refresh_memory(self) -> None:
        self._last_memory_s = time.perf_counter()
        self._panel.show_memory(*self.chat_app.memory_reader())

    # -- turn end ----------------------------------------------------------------------------

    async def _on_dropped(self, turn: Turn, n: int) -> None:
        if turn is not self.turn:
            return
        for old in [t for t in self.turns if t is not turn and not t.dropped][:n]:
            old.dropped = True
            old.user.add_class("dropped")
            old.assistant.add_class("dropped")
        await self.note(dropped_note(n), "warn", before=turn.user)

    async def _finish_turn(self, turn: Turn, result: Any, error: str | None) -> None:
        if turn is not self.turn:  # a new chat or a restore replaced it
            return
        turn.assistant.append(turn.tracker.add(turn.feed.drain()))
        if result is not None:
            g = result.generation
            turn.tracker.finish(g)
            await turn.assistant.finish(stats_footer(generation_stats(g), g.finish_reason), g.finish_reason)
        else:
            await turn.assistant.finish(f"error: {error}", "error")
            await self.note(error or "generation failed", "error")
        self.turn = None
        self._stop_tick()
        if turn.following:
            self._transcript.anchor()  # back to sticking to the bottom
        self.show_turn_stats(turn)
        self.show_context()  # the engine's own count once the turn is over
        await self._after_turn()

    async def _after_turn(self) -> None:
        app = self.chat_app
        if app.session is not None and app.session.history_error:
            await self.note(f"History not saved: {app.session.history_error}", "warn")
            app.session.history_error = None
        level = self.show_context()
        if level != "ok" and self._ctx_level == "ok":
            engine = app.engine
            await self.note(
                f"Context nearly full ({engine.kv_cache_tokens}/{engine.n_ctx} tokens): when a new turn does not fit, "
                "the oldest turns are dropped (the system prompt stays).",
                "warn",
            )
        self._ctx_level = level
        self.idle_status()
        await self.send_queued()

    # -- actions -----------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.turn is not None and not self.turn.cancel.is_set():
            self.turn.cancel.set()
            self.set_status("cancelling…", "busy")

    async def clear(self) -> None:
        """Forget what is on screen (new chat, restore); a running turn is cancelled."""
        if self.turn is not None:
            self.turn.cancel.set()
        self.turn = None
        self._stop_tick()
        self.turns.clear()
        self.queue.clear()
        self._ctx_level = "ok"
        await self._transcript.clear()
        self.query_one(StatsPanel).show_live(None)

    async def show_conversation(self, conv: Conversation) -> None:
        """Rebuild the transcript of a saved conversation."""
        transcript = self._transcript
        if conv.system:
            await transcript.add_note(f"System prompt: {conv.system}")
        for m in conv.messages:
            if m.role == "user":
                await transcript.add_user(m.content)
            elif m.role == "assistant":
                widget = await transcript.add_assistant(m.content)
                await widget.finish(stats_footer(m.stats, m.finish_reason), m.finish_reason)
            elif m.role == "note":
                await transcript.add_note(m.content, "warn")
        await transcript.add_note(f"Reopened “{conv.title or conv.id}”: the next message continues it.")
