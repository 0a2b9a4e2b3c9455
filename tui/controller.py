"""The chat's state and its engine calls, with no drawing and no Textual: what the main screen shows.

ChatController owns what the app was built with (the engine factory, settings, history
store, model label, conversation to resume, extra sampling options, memory reader, export
folder), the engine and session once loaded (or the load error), busy/idle, the turn
streaming now, the turns shown and the messages queued while busy.

The main screen (screens/chat.py) calls the blocking methods (`load`, `run_task`,
`generate`) in thread workers, posts what they return to itself as messages, and on the UI
thread updates this state and draws from it. Every other method is for the UI thread.
Widgets appear here only as opaque handles the screen made (Turn.user, Turn.assistant,
Queued.widget): this module never touches them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from ondevice.tui.live import LiveFeed, LiveTracker, context_level
from ondevice.tui.session import ChatSession, ChatSettings, TurnResult
from ondevice.tui.store import Conversation, HistoryStore

from ondevice.core import paths
from ondevice.core.errors import OndeviceError
from ondevice.engine.interface import PredictsTTFT

__all__ = [
    "ChatController",
    "ContextUse",
    "EngineFactory",
    "LoadResult",
    "MemoryReader",
    "Queued",
    "Turn",
    "process_memory",
]

log = logging.getLogger(__name__)
EngineFactory = Callable[[], Any]
MemoryReader = Callable[[], "tuple[int | None, int | None, int | None]"]


def process_memory() -> tuple[int | None, int | None, int | None]:
    """(process RSS, system memory in use, system memory total), bytes; None when unknown."""
    try:
        vm = psutil.virtual_memory()
        return psutil.Process().memory_info().rss, vm.total - vm.available, vm.total
    except (psutil.Error, OSError):
        return None, None, None


@dataclass
class Turn:
    """One user message and the answer being streamed for it."""

    text: str
    user: Any  # the screen's widget for the message
    assistant: Any  # the screen's widget for the answer
    tracker: LiveTracker
    feed: LiveFeed = field(default_factory=LiveFeed)  # token events: the generation thread pushes, the UI drains
    cancel: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False  # no longer in the model's context


@dataclass(frozen=True)
class Queued:
    """A message typed while the engine was busy; sent when it is free, in order."""

    text: str
    widget: Any  # the screen's widget showing it as queued


@dataclass(frozen=True)
class LoadResult:
    """What the load worker built; an engine may come with an error (the chat could not start)."""

    engine: Any = None
    session: ChatSession | None = None
    conversation: Conversation | None = None  # reopened (resume)
    error: str | None = None


@dataclass(frozen=True)
class ContextUse:
    """The KV cache's use, for the stats panel."""

    used: int  # tokens
    n_ctx: int  # tokens
    kv_bytes: int | None
    level: str  # context_level(): ok, warn, full


def error_text(exc: BaseException, what: str) -> str:
    """One line for the screen: a library error as it says; anything else typed, logged with its traceback."""
    if isinstance(exc, OndeviceError):
        return str(exc)
    log.error("%s failed", what, exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


class ChatController:
    """The chat's state for one app run; the main screen is given it at construction."""

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        settings: ChatSettings | None = None,
        store: HistoryStore | None = None,
        model_label: str = "model",
        resume: int | None = None,
        extra_sampling: Mapping[str, Any] | None = None,
        memory_reader: MemoryReader = process_memory,
        export_dir: Path | None = None,
    ):
        self.engine_factory = engine_factory
        self.settings = (settings or ChatSettings()).validated()
        self.store = store
        self.model_label = model_label
        self.resume = resume  # conversation id to reopen once the model is loaded
        self.extra_sampling = dict(extra_sampling or {})
        self.memory_reader = memory_reader  # polled for the stats panel
        self.export_dir = export_dir  # where Ctrl+S writes (None: the data dir's exports/)
        self.engine: Any = None  # set when loading ends (also when the chat could not start: close it on exit)
        self.session: ChatSession | None = None
        self.load_error: str | None = None
        self.busy_reason: str | None = None  # "loading", "starting a new chat", ...: engine not free for a turn
        self.turn: Turn | None = None  # the turn streaming now
        self.turns: list[Turn] = []  # turns shown, oldest first
        self.queue: list[Queued] = []  # sent while busy; go out in order
        self.ctx_level = "ok"  # context_level() after the last turn

    # -- state ----------------------------------------------------------------------------

    @property
    def generating(self) -> bool:
        """True while an answer streams, a message is queued or the engine is busy."""
        return self.turn is not None or bool(self.queue) or bool(self.busy_reason)

    @property
    def idle(self) -> bool:
        """The engine is loaded and free for a turn."""
        return self.session is not None and self.turn is None and not self.busy_reason

    @property
    def can_send_now(self) -> bool:
        """A new message goes out at once (else it queues behind the others)."""
        return self.idle and not self.queue

    @property
    def title(self) -> str:
        """The model's name once loaded, else the label the app was given."""
        spec = getattr(getattr(self.engine, "info", None), "spec", None)
        return (spec.name if spec is not None else None) or self.model_label

    @property
    def engine_threads(self) -> int | None:
        return getattr(getattr(self.engine, "info", None), "n_threads", None)

    def status_line(self) -> str | None:
        """The idle status (load time, backend, context, queued messages); None before the model is loaded."""
        if self.session is None:
            return None
        info = self.engine.info
        queued = f" · {len(self.queue)} queued" if self.queue else ""
        return f"ready · loaded in {info.load_s:.2f} s · {info.backend} · ctx {self.engine.n_ctx}{queued}"

    def context(self, used: int | None = None) -> ContextUse | None:
        """The KV cache's use (the engine's own count unless `used` is given); None with no engine."""
        engine = self.engine
        if engine is None:
            return None
        used = engine.kv_cache_tokens if used is None else used
        level = context_level(used, engine.n_ctx, reserve=self.settings.max_tokens)
        spec = engine.info.spec
        kv_bytes = spec.kv_read_bytes(used) if spec.kv_bytes_per_token_by_layer else None
        return ContextUse(used, engine.n_ctx, kv_bytes, level)

    def context_warning(self, level: str) -> str | None:
        """The warning to show when the context just left 'ok' (once, until it is ok again)."""
        warn = level != "ok" and self.ctx_level == "ok"
        self.ctx_level = level
        if not warn:
            return None
        return (
            f"Context nearly full ({self.engine.kv_cache_tokens}/{self.engine.n_ctx} tokens): when a new turn does "
            "not fit, "
            "the oldest turns are dropped (the system prompt stays)."
        )

    def take_history_error(self) -> str | None:
        """The last failed history write, once."""
        if self.session is None or not self.session.history_error:
            return None
        error, self.session.history_error = self.session.history_error, None
        return error

    def memory(self) -> tuple[int | None, int | None, int | None]:
        return self.memory_reader()

    # -- busy: loading and engine tasks ---------------------------------------------------------

    def begin_task(self, what: str) -> None:
        """The engine is busy with `what` ("loading", "starting a new chat", ...): new messages queue."""
        self.busy_reason = what

    def end_task(self) -> None:
        self.busy_reason = None

    # -- loading --------------------------------------------------------------------------

    def load(self) -> LoadResult:
        """Build the engine and the session, reopen `resume` (worker thread). Never raises."""
        engine = session = conv = None
        try:
            engine = self.engine_factory()
            session = ChatSession(engine, self.settings, self.store, self.model_label, self.extra_sampling)
            if self.resume is not None and self.store is not None:
                conv = self.store.load(self.resume)
                session.restore(conv)
        except Exception as exc:  # shown on screen, never a traceback
            return LoadResult(engine, None, None, error_text(exc, "model load"))
        return LoadResult(engine, session, conv)

    @staticmethod
    def discard(result: LoadResult) -> None:
        """Close what a load built when nobody is left to use it (the app quit meanwhile)."""
        if result.engine is not None:
            result.engine.close()

    def finish_loading(self, result: LoadResult) -> list[Queued]:
        """Take the load's result (UI thread). On failure the queue is dropped: returns what was in it."""
        self.end_task()
        self.engine = result.engine  # kept even when the chat could not start, so it is closed on exit
        if result.error is not None:
            self.load_error = result.error
            failed, self.queue = self.queue, []
            return failed
        self.session = result.session
        if result.conversation is not None:
            self.settings = result.session.settings
        return []

    # -- engine tasks (new chat, restore, settings) -------------------------------------------

    def run_task(self, fn: Callable[[], None], what: str = "engine task") -> str | None:
        """Run `fn` (worker thread); the error's one line, or None."""
        try:
            fn()
        except Exception as exc:
            return error_text(exc, what)
        return None

    def change_settings(self, settings: ChatSettings | None) -> bool:
        """Take new settings from the settings screen; True when the session must apply them."""
        if settings is None or settings == self.settings:
            return False
        self.settings = settings
        return self.session is not None

    def apply_settings(self, settings: ChatSettings) -> None:
        """The session's part of change_settings (worker thread)."""
        self.session.apply_settings(settings)

    def new_chat(self) -> None:
        """Forget the conversation and clear the KV cache (worker thread)."""
        self.session.new_chat()

    def conversation(self, conversation_id: int | None) -> Conversation | None:
        """A saved conversation to reopen; None when there is none or no chat to reopen it in."""
        if conversation_id is None or self.session is None or self.store is None:
            return None
        return self.store.load(conversation_id)

    def restore(self, conversation: Conversation) -> None:
        """Continue a saved conversation, with its settings (worker thread)."""
        self.session.restore(conversation)
        self.settings = self.session.settings

    def export(self) -> Path | None:
        """Write the conversation as Markdown and JSON (export_dir, else the data dir's exports/);
        the .md path, or None when there is nothing yet. Raises OndeviceError when a file cannot be written."""
        cid = self.session.conversation_id if self.session is not None else None
        if self.store is None or cid is None:
            return None
        folder = self.export_dir or paths.data_dir() / "exports"
        stem = f"chat-{cid}-{time.strftime('%Y%m%d-%H%M%S')}"
        md = self.store.export(cid, folder / f"{stem}.md")
        self.store.export(cid, folder / f"{stem}.json")
        return md

    # -- turns ------------------------------------------------------------------------------

    def enqueue(self, text: str, widget: Any) -> int:
        """Queue a message typed while busy; how many are queued now."""
        self.queue.append(Queued(text, widget))
        return len(self.queue)

    def next_queued(self) -> Queued | None:
        """The oldest queued message, taken off the queue, when the engine is free for it."""
        return self.queue.pop(0) if self.queue and self.idle else None

    def start_turn(self, text: str, user: Any, assistant: Any) -> Turn:
        """The turn streaming from now on (the app is busy: a new message queues)."""
        engine = self.engine
        tracker = LiveTracker(engine.predictor, engine.kv_cache_tokens, predicted_ttft_s=self._predicted_ttft(text))
        turn = Turn(text, user, assistant, tracker)
        self.turn = turn
        self.turns.append(turn)
        return turn

    def _predicted_ttft(self, text: str) -> float | None:
        """The roofline's TTFT for this message's prompt, counting what the KV cache already holds
        (shown while the user waits for the first token); None without a prefill model."""
        predictor = self.engine.predictor
        if not isinstance(predictor, PredictsTTFT) or self.session is None:
            return None
        try:
            ids = self.session.chat.prompt_tokens(text)
            return predictor.ttft_s(len(ids), self.engine.cached_prefix(ids))
        except Exception:  # a prompt that cannot be rendered fails in the worker, with its message
            return None

    def is_current(self, turn: Turn) -> bool:
        """False once a new chat or a restore replaced it."""
        return turn is self.turn

    def generate(self, turn: Turn, on_dropped: Callable[[int], None]) -> tuple[TurnResult | None, str | None]:
        """Stream the turn's answer into its feed (worker thread): (result, None) or (None, error)."""
        try:
            return self.session.run_turn(turn.text, turn.cancel, turn.feed.push, on_dropped=on_dropped), None
        except Exception as exc:  # shown on screen, never a traceback
            return None, error_text(exc, "generation")

    def drift_warning(self, generation: Any) -> str | None:
        """What to say when this answer and the ones before it all missed their prediction one way: the machine's
        speed has moved since the model was timed (probing.drift). None otherwise."""
        from ondevice.probing.drift import note_predicted_run

        drift = note_predicted_run(getattr(self.engine, "predictor", None), generation)
        return None if drift is None else f"{drift.describe()}; `ondevice chat --retime` times it again."

    def mark_dropped(self, turn: Turn, n: int) -> list[Turn]:
        """The oldest n turns before `turn` left the context; those newly marked."""
        old = [t for t in self.turns if t is not turn and not t.dropped][:n]
        for t in old:
            t.dropped = True
        return old

    def end_turn(self) -> None:
        self.turn = None

    def cancel(self) -> bool:
        """Stop the answer streaming now at its next token; False when there is none (or it is already stopping)."""
        if self.turn is None or self.turn.cancel.is_set():
            return False
        self.turn.cancel.set()
        return True

    def clear(self) -> None:
        """Forget the turns and the queue (new chat, restore); a running turn is cancelled."""
        self.cancel()
        self.turn = None
        self.turns.clear()
        self.queue.clear()
        self.ctx_level = "ok"
