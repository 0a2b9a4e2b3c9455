"""The main screen: transcript and input on the left, the stats panel on the right.

Attributes down, messages up: the screen is given a ChatController (tui/controller.py), which
holds the chat's state (engine, session, settings, the turn streaming now, the queue, busy or
idle); the screen draws from it and never reads the app. Blocking calls (load, engine tasks,
generation) run in thread workers that post their outcome to the screen as messages
(Loaded, TaskDone, TurnDropped, TurnDone); the handlers update the controller and the
widgets on the UI thread. The app reaches the screen only through the commands `new_chat`,
`apply_settings` and `open_conversation`; the screen tells the app the model's name with
the bubbling ModelNamed message.

Generation runs in a thread worker that only pushes token events into the turn's LiveFeed;
a timer drains it (at most 10 frames a second, fewer when the UI thread would spend more
than its CPU budget), appends the new text in one batch (finished blocks drawn as
Markdown, the block being written as plain text, in a box sized ahead: no layout pass)
and refreshes the stats. A tick with no new token repaints nothing. Engine calls never
run on the UI thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ondevice.tui.controller import ChatController, Turn
from ondevice.tui.live import generation_stats
from ondevice.tui.pacing import TICK_S, Frames, no_spare_core, ui_cpu_budget
from ondevice.tui.screens.messages import Loaded, ModelNamed, TaskDone, TaskThen, TurnDone, TurnDropped
from ondevice.tui.session import ChatSettings, dropped_note
from ondevice.tui.store import Conversation
from ondevice.tui.widgets.stats import StatsPanel, model_card_lines
from ondevice.tui.widgets.transcript import AssistantMessage, Note, Transcript, UserMessage
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Input, Static

from ondevice.core.fmt import stats_footer
from ondevice.core.textclean import clean_text

__all__ = ["ChatScreen"]

log = logging.getLogger(__name__)
MEMORY_TICK_S = 2.0  # RSS / system memory refresh period
# One line each instead of Textual's Header and Footer: fewer widgets make every frame and
# every layout pass cheaper while tokens stream.
KEYS_BAR = (
    "[b]esc[/] cancel  [b]^n[/] new  [b]f2[/] settings  [b]^o[/] history  [b]^s[/] export  [b]f1[/] keys  [b]^q[/] quit"
)


class ChatScreen(Screen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=True)]

    def __init__(self, controller: ChatController) -> None:
        super().__init__()
        self.controller = controller
        self._frames = Frames()
        self._tick: Timer | None = None  # one-shot, re-armed after each frame (see _on_tick)
        self._last_memory_s = 0.0  # perf_counter() of the last memory refresh

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
        self.set_interval(MEMORY_TICK_S, self._memory_tick)
        self.refresh_memory()
        self._start_loading()

    def on_unmount(self) -> None:
        """The app is going away: stop a running answer so its thread ends at the next token."""
        self.controller.cancel()

    def _post(self, message: Message) -> bool:
        """post_message from a worker thread; False when the screen (or the app) is already gone."""
        if not self.app.is_running:
            return False
        try:
            return self.post_message(message)
        except RuntimeError:  # the event loop closed meanwhile
            log.debug("UI update after exit dropped", exc_info=True)
            return False

    # -- status ------------------------------------------------------------------------------

    def set_title(self, model: str) -> None:
        self.query_one("#title", Static).update(f"◆ ondevice chat — {model}", layout=False)

    def set_status(self, text: str, kind: str = "info") -> None:
        status = self.query_one("#status", Static)
        for name in ("info", "busy", "error"):
            status.set_class(name == kind, f"status-{name}")
        status.update(text, layout=False)  # one line, always: no layout pass needed

    def idle_status(self) -> None:
        line = self.controller.status_line()
        if line is not None:
            self.set_status(line)

    async def note(self, text: str, kind: str = "info", before: Any = None) -> None:
        transcript = self._transcript
        if before is not None and before.is_attached:
            await transcript.mount(Note(text, kind=kind), before=before)
        else:
            await transcript.add_note(text, kind)

    # -- loading -----------------------------------------------------------------------------

    def _start_loading(self) -> None:
        c = self.controller
        c.begin_task("loading")
        self.set_title(c.model_label)
        self.set_status(f"loading {c.model_label}… (you can type meanwhile)", "busy")
        self._load()

    @work(thread=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        result = self.controller.load()
        if not self._post(Loaded(result)):
            self.controller.discard(result)

    async def on_chat_screen_loaded(self, message: Loaded) -> None:
        c = self.controller
        failed = c.finish_loading(message.result)
        if c.load_error is not None:
            self.set_status(f"model failed to load: {c.load_error}", "error")
            await self.note(f"Could not load {c.model_label}: {c.load_error}", "error")
            for queued in failed:
                queued.widget.add_class("failed")
            self._panel.show_model([c.model_label, "not loaded"])
            return
        self.post_message(ModelNamed(c.title))
        self.set_title(c.title)
        self._panel.show_model(model_card_lines(c.engine.info))
        if message.result.conversation is not None:
            await self.show_conversation(message.result.conversation)
        if c.engine.predictor is None:
            await self.note("No probe results for this machine yet: run `ondevice probe` to see the predicted ceiling.")
        self.show_context()
        self.idle_status()
        await self.send_queued()

    # -- engine tasks and the app's commands -------------------------------------------------

    def _run_engine_task(self, what: str, fn: Callable[[], None], then: TaskThen | None = None) -> None:
        self.controller.begin_task(what)
        self.set_status(f"{what}…", "busy")
        self._engine_task(what, fn, then)

    @work(thread=True, group="engine-task", exit_on_error=False)
    def _engine_task(self, what: str, fn: Callable[[], None], then: TaskThen | None) -> None:
        self._post(TaskDone(then, self.controller.run_task(fn, what)))

    async def on_chat_screen_task_done(self, message: TaskDone) -> None:
        self.controller.end_task()
        if message.then is not None:
            result = message.then(message.error)
            if hasattr(result, "__await__"):
                await result
        elif message.error:
            await self.note(message.error, "error")
        self.show_context()
        self.idle_status()
        await self.send_queued()

    def apply_settings(self, settings: ChatSettings | None) -> None:
        """Command (the settings screen's result): new settings apply from the next message."""
        if not self.controller.change_settings(settings):
            return

        async def done(error: str | None) -> None:
            text = (
                error
                or f"Settings: temperature {settings.temperature:g}, top p {settings.top_p:g}, "
                f"max tokens {settings.max_tokens}"
            )
            await self.note(text + (f", system prompt “{settings.system}”" if settings.system and not error else ""))

        self._run_engine_task("applying settings", lambda: self.controller.apply_settings(settings), done)

    async def new_chat(self) -> None:
        """Command: clear the transcript and the KV cache."""
        if self.controller.session is None:
            return
        await self.clear()

        async def done(error: str | None) -> None:
            await self.note(error or "New chat: the KV cache is cleared.", "error" if error else "info")

        self._run_engine_task("starting a new chat", self.controller.new_chat, done)

    async def open_conversation(self, conversation_id: int | None) -> None:
        """Command (the history picker's result): reopen a saved conversation."""
        conv = self.controller.conversation(conversation_id)
        if conv is None:
            return
        await self.clear()
        await self.show_conversation(conv)
        self._run_engine_task("reopening the conversation", lambda: self.controller.restore(conv))

    # -- sending -----------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = clean_text(event.value).strip()  # lone surrogates (a paste of non-UTF-8 bytes) become U+FFFD
        event.input.value = ""
        if text:
            await self.submit(text)

    async def submit(self, text: str) -> None:
        """Send now if the engine is free, else show the message as queued."""
        c = self.controller
        if not c.can_send_now:
            if c.load_error is not None:
                await self.note(f"No model loaded: {c.load_error}", "error")
                return
            widget = await self._transcript.add_user(text, queued=True)
            n = c.enqueue(text, widget)
            self.set_status(f"{n} queued: will be sent when the model is free", "busy")
            return
        await self._start_turn(text, None)

    async def send_queued(self) -> None:
        queued = self.controller.next_queued()
        if queued is not None:
            await self._start_turn(queued.text, queued.widget)

    async def _start_turn(self, text: str, user: UserMessage | None) -> None:
        transcript = self._transcript
        c = self.controller
        queued, user = user is not None, user or UserMessage(text)
        assistant = AssistantMessage(reserve_rows=transcript.reserve_for(c.settings.max_tokens))
        threads, cores = c.engine_threads, os.cpu_count()
        self._frames = Frames(ui_budget=ui_cpu_budget(threads, cores))
        turn = c.start_turn(text, user, assistant)  # from now on a new message queues, also while the widgets mount
        if queued:
            user.remove_class("queued")
            await transcript.mount(assistant)
        else:
            await transcript.mount_all([user, assistant])  # one layout pass for both
        if not c.is_current(turn):  # a new chat or a restore came while they mounted
            return
        transcript.scroll_to_widget(user, animate=False, immediate=True, top=True)
        transcript.anchor(False)  # the view follows the text by hand (Transcript.follow)
        self.set_status("generating · Esc cancels", "busy")
        self._arm_tick(TICK_S)
        if no_spare_core(threads, cores):
            # The request starts once the new messages are on screen: laying them out and
            # painting them takes the UI thread a noticeable part of a second on a small machine, which would
            # otherwise take a core from prefill, slow it, and count in this message's TTFT.
            self.call_after_refresh(self._begin, turn)
        else:  # a core is left for the UI: painting and prefill run side by side
            self._begin(turn)

    def _begin(self, turn: Turn) -> None:
        if self.controller.is_current(turn):  # not replaced by a new chat or a restore meanwhile
            self._generate(turn)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn) -> None:
        result, error = self.controller.generate(turn, on_dropped=lambda n: self._post(TurnDropped(turn, n)))
        self._post(TurnDone(turn, result, error))

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
        (the frame's own rendering included) stays within its budget (tui/pacing.py): on a
        fast machine that is the full 10 Hz, on a slow or busy one fewer frames."""
        self._tick = None
        turn = self.controller.turn
        if turn is None:
            return
        events = turn.feed.drain()
        if not events:  # nothing new: no repaint at all; look again in a tick
            self._arm_tick(TICK_S)
            return
        delay_s = self._frames.pace(time.thread_time())
        turn.assistant.append(turn.tracker.add(events))
        self._follow(turn)
        self.show_turn_stats(turn)
        self._arm_tick(delay_s)

    def _follow(self, turn: Turn) -> None:
        frames = self._frames
        if frames.following:
            stream = turn.assistant.stream
            frames.scrolled_y = self._transcript.follow(stream, max(0, stream.row_count - 1), frames.scrolled_y)
            frames.following = frames.scrolled_y is not None

    def show_turn_stats(self, turn: Turn) -> None:
        stats = turn.tracker.stats()
        self._panel.show_live(stats, turn.tracker.itl_s)
        self.show_context(stats.n_ctx_used)
        if time.perf_counter() - self._last_memory_s >= MEMORY_TICK_S:
            self.refresh_memory()

    def show_context(self, used: int | None = None) -> str:
        ctx = self.controller.context(used)
        if ctx is None:
            return "ok"
        self._panel.show_context(ctx.used, ctx.n_ctx, ctx.kv_bytes, ctx.level)
        return ctx.level

    def _memory_tick(self) -> None:
        if self.controller.turn is None:  # while tokens stream, frames refresh it (no extra repaint)
            self.refresh_memory()

    def refresh_memory(self) -> None:
        self._last_memory_s = time.perf_counter()
        self._panel.show_memory(*self.controller.memory())

    # -- turn end ----------------------------------------------------------------------------

    async def on_chat_screen_turn_dropped(self, message: TurnDropped) -> None:
        turn = message.turn
        if not self.controller.is_current(turn):
            return
        for old in self.controller.mark_dropped(turn, message.n):
            old.user.add_class("dropped")
            old.assistant.add_class("dropped")
        await self.note(dropped_note(message.n), "warn", before=turn.user)

    async def on_chat_screen_turn_done(self, message: TurnDone) -> None:
        turn, result, error = message.turn, message.result, message.error
        if not self.controller.is_current(turn):  # a new chat or a restore replaced it
            return
        turn.assistant.append(turn.tracker.add(turn.feed.drain()))
        if result is not None:
            g = result.generation
            turn.tracker.finish(g)
            await turn.assistant.finish(stats_footer(generation_stats(g), g.finish_reason), g.finish_reason)
            drift = self.controller.drift_warning(g)
            if drift:
                await self.note(drift, "warn")
        else:
            await turn.assistant.finish(f"error: {error}", "error")
            await self.note(error or "generation failed", "error")
        self.controller.end_turn()
        self._stop_tick()
        if self._frames.following:
            self._transcript.anchor()  # back to sticking to the bottom
        self.show_turn_stats(turn)
        self.show_context()  # the engine's own count once the turn is over
        await self._after_turn()

    async def _after_turn(self) -> None:
        c = self.controller
        history_error = c.take_history_error()
        if history_error:
            await self.note(f"History not saved: {history_error}", "warn")
        warning = c.context_warning(self.show_context())
        if warning:
            await self.note(warning, "warn")
        self.idle_status()
        await self.send_queued()

    # -- actions -----------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.controller.cancel():
            self.set_status("cancelling…", "busy")

    async def clear(self) -> None:
        """Forget what is on screen (new chat, restore); a running turn is cancelled."""
        self.controller.clear()
        self._stop_tick()
        await self._transcript.clear()
        self._panel.show_live(None)

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
        if conv.notes:  # a damaged history row: what was replaced or left out
            more = f" (and {len(conv.notes) - 1} more)" if len(conv.notes) > 1 else ""
            await transcript.add_note(f"Damaged history: {conv.notes[0]}{more}", "warn")
        await transcript.add_note(f"Reopened “{conv.title or conv.id}”: the next message continues it.")
        resumed = getattr(self.controller.session, "resume_note", None)
        if resumed:  # the saved KV state restored or recomputed, with both predicted figures
            await transcript.add_note(resumed[:1].upper() + resumed[1:] + ".")
