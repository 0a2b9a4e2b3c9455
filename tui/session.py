"""One conversation on one engine, with its history record. No UI here.

Every method that touches the engine takes `lock`, and is called from a worker thread:
the UI thread never blocks on llama.cpp. A turn that does not fit the context drops the
oldest user+assistant pairs (the system prompt stays) until it fits, and says how many.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ondevice.tui.live import generation_stats
from ondevice.tui.store import Conversation, HistoryError, HistoryStore

from ondevice.core.errors import ContextOverflowError, InvalidParameterError, OndeviceError, StateFileError
from ondevice.core.results import Generation, TokenEvent
from ondevice.core.textclean import clean_text
from ondevice.engine.interface import PredictsPrefill
from ondevice.engine.sampling import CHAT_MAX_TOKENS, DEFAULTS
from ondevice.engine.state import choose_resume

__all__ = ["ChatSettings", "ChatSession", "TurnResult", "dropped_note"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatSettings:
    """What the settings screen edits."""

    system: str | None = None  # system prompt; None or "" = none
    temperature: float = DEFAULTS.temperature  # sampling temperature, >= 0 (0 = greedy)
    top_p: float = DEFAULTS.top_p  # nucleus sampling, in (0, 1]
    max_tokens: int = CHAT_MAX_TOKENS  # most tokens in one answer, >= 1
    speculative: str | None = (
        None  # "lookup": speculative decoding by prompt lookup (`chat --speculative lookup`); None = off
    )

    def validated(self) -> ChatSettings:
        """The same settings, checked; raises InvalidParameterError naming the bad one."""
        if not (self.temperature >= 0) or self.temperature > 100:
            raise InvalidParameterError(f"temperature must be between 0 and 100, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be a positive integer, got {self.max_tokens}")
        if self.speculative not in (None, "lookup"):
            raise InvalidParameterError(f"speculative must be 'lookup' or none, got {self.speculative!r}")
        system = clean_text(self.system).strip() if self.system else None  # storable and tokenizable
        return ChatSettings(
            system or None, float(self.temperature), float(self.top_p), int(self.max_tokens), self.speculative
        )

    def sampling(self) -> dict[str, Any]:
        spec = {"speculative": self.speculative} if self.speculative else {}
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens, **spec}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TurnResult:
    generation: Generation  # the finished answer, with every timing
    dropped_turns: int  # user+assistant pairs dropped so that this turn fits


@dataclass
class ChatSession:
    """The engine's Chat plus the conversation's row in the history store."""

    engine: Any  # an ondevice Engine (or a test double with the same interface)
    settings: ChatSettings
    store: HistoryStore | None = None
    model_label: str = "model"
    extra_sampling: Mapping[str, Any] = field(default_factory=dict)  # passed to every stream (e.g. ignore_eos)
    conversation_id: int | None = None  # history row; created with the first message
    history_error: str | None = None  # the last history write that failed, for the UI to show once
    resume_note: str | None = None  # how a reopened conversation's KV cache was had: restored or recomputed, why
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.chat = self.engine.chat(system=self.settings.system)

    # -- turns (worker thread) --------------------------------------------------------------

    def run_turn(
        self,
        text: str,
        cancel: threading.Event,
        on_event: Callable[[TokenEvent], None],
        on_dropped: Callable[[int], None] | None = None,
    ) -> TurnResult:
        """Send `text`, stream the answer into on_event, record both. Holds the lock throughout."""
        with self.lock:
            self._record("user", text)
            events, dropped = self._open(text, cancel)
            if dropped:
                note = dropped_note(dropped)
                self._record("note", note)
                if on_dropped is not None:
                    on_dropped(dropped)
            for event in events:
                on_event(event)
            generation = events.generation
            self._record(
                "assistant",
                self._reply_text(generation),
                finish_reason=generation.finish_reason,
                stats=generation_stats(generation),
            )
            self._save_state()
            return TurnResult(generation, dropped)

    def _reply_text(self, generation: Generation) -> str:
        """The reply as the chat keeps it (the engine may trim the space after "Assistant:")."""
        last = self.chat.messages[-1] if self.chat.messages else None
        if last is not None and last.get("role") == "assistant":
            return str(last.get("content", generation.text))
        return generation.text

    def _open(self, text: str, cancel: threading.Event) -> tuple[_Primed, int]:
        """Open the stream, dropping the oldest turns while the engine says it cannot fit."""
        dropped = 0
        kwargs = {**self.settings.sampling(), **self.extra_sampling, "cancel": cancel}
        while True:
            n_before = len(self.chat.messages)
            try:
                stream = self.chat.stream(text, **kwargs)
                return _Primed(stream), dropped
            except ContextOverflowError as exc:
                del self.chat.messages[n_before:]  # a refused turn leaves no trace in the chat
                if not self.chat.drop_oldest_turn():
                    raise ContextOverflowError(
                        f"{exc} — nothing left to drop: shorten the message or lower max tokens in settings (F2)"
                    ) from exc
                dropped += 1

    # -- conversation management (worker thread) ----------------------------------------------

    def new_chat(self) -> None:
        """Forget the conversation and clear the KV cache."""
        with self.lock:
            self.engine.reset()
            self.chat = self.engine.chat(system=self.settings.system)
            self.conversation_id = None

    def restore(self, conversation: Conversation) -> None:
        """Continue a saved conversation: its messages become the chat's (notes left out)."""
        with self.lock:
            self.engine.reset()
            self.settings = self._settings_of(conversation)
            self.chat = self.engine.chat(system=self.settings.system)
            for m in conversation.messages:
                if m.role in ("user", "assistant"):
                    self.chat.messages.append({"role": m.role, "content": m.content})
            self.conversation_id = conversation.id
            self.resume_note = self._resume_state()

    def state_path(self) -> Path | None:
        """Where this conversation's KV state is kept: beside the history database, one file per conversation."""
        db = getattr(self.store, "path", None)
        if db is None or self.conversation_id is None:
            return None
        return Path(db).parent / "kv-states" / f"{Path(db).stem}-{self.conversation_id}.kv"

    def _save_state(self) -> None:
        """Keep the KV state after a turn, so reopening the conversation can skip recomputing it."""
        save, path = getattr(self.engine, "save_state", None), self.state_path()
        if save is None or path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save(path)
        except (OSError, OndeviceError) as exc:  # the chat goes on; reopening recomputes
            log.warning("conversation state not saved: %s", exc)

    def _resume_state(self) -> str | None:
        """Restore the conversation's saved state when predicted faster than recomputing it; what was chosen."""
        load, path = getattr(self.engine, "load_state", None), self.state_path()
        if load is None or path is None or not path.is_file():
            return None
        choice = choose_resume(path.stat().st_size, _disk_read_gbs(), self._recompute_s())
        if choice.restore:
            try:
                load(path)
            except StateFileError as exc:
                return f"{exc}; recomputing the conversation"
        return choice.text()

    def _recompute_s(self) -> float | None:
        """Predicted prefill of the conversation so far (None without a predictor)."""
        predictor = self.engine.predictor
        if not isinstance(predictor, PredictsPrefill):
            return None
        return predictor.prefill_s(len(self.chat.prompt_tokens()))

    def _settings_of(self, conversation: Conversation) -> ChatSettings:
        """The conversation's settings; the current sampling where the stored one is not valid (a damaged store)."""
        spec = self.settings.speculative
        try:
            return ChatSettings(conversation.system, *self._sampling_of(conversation), speculative=spec).validated()
        except (InvalidParameterError, TypeError, ValueError):
            cur = self.settings
            return ChatSettings(conversation.system, cur.temperature, cur.top_p, cur.max_tokens, spec).validated()

    def _sampling_of(self, conversation: Conversation) -> tuple[float, float, int]:
        s = conversation.settings
        cur = self.settings
        return (
            s.get("temperature", cur.temperature),
            s.get("top_p", cur.top_p),
            s.get("max_tokens", cur.max_tokens),
        )

    def apply_settings(self, settings: ChatSettings) -> None:
        """New sampling settings apply to the next turn; a new system prompt replaces the old one."""
        settings = settings.validated()
        with self.lock:
            if settings.system != self.settings.system:
                _set_system(self.chat.messages, settings.system)
                if hasattr(self.chat, "system"):
                    self.chat.system = settings.system  # what Chat.reset() keeps
                if self.store is not None and self.conversation_id is not None:
                    self._safe(self.store.set_system, self.conversation_id, settings.system)
            self.settings = settings

    # -- history ------------------------------------------------------------------------------

    def _record(self, role: str, content: str, **kw: Any) -> None:
        if self.store is None:
            return
        if self.conversation_id is None:
            cid = self._safe(
                self.store.create_conversation, self.model_label, self.settings.system, self.settings.sampling()
            )
            if cid is None:
                return
            self.conversation_id = cid
        self._safe(self.store.add_message, self.conversation_id, role, content, **kw)

    def _safe(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A history write that fails never stops the chat; the UI shows history_error."""
        try:
            return fn(*args, **kw)
        except HistoryError as exc:
            log.warning("history not saved: %s", exc)
            self.history_error = str(exc)
            return None


class _Primed:
    """Iterator over a TokenStream whose first event is pulled at once, so an error the
    engine raises lazily (on first next()) surfaces where the stream is opened."""

    def __init__(self, stream: Any):
        self._stream = stream
        self._it = iter(stream)
        self._first = next(self._it, None)

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        yield from self._it

    @property
    def generation(self) -> Generation:
        return self._stream.generation


def _set_system(messages: list[dict], system: str | None) -> None:
    has = bool(messages) and messages[0].get("role") == "system"
    if system and has:
        messages[0] = {"role": "system", "content": system}
    elif system:
        messages.insert(0, {"role": "system", "content": system})
    elif has:
        del messages[0]


def dropped_note(n: int) -> str:
    turns = "turn" if n == 1 else "turns"
    return f"Context full: dropped the oldest {n} {turns} to make room (the system prompt is kept)."


def _disk_read_gbs() -> float | None:
    """The host probe's disk read rate (GB/s) from its cache; None when no probe measured it."""
    from ondevice.probing import cached_probe

    try:
        probe = cached_probe()
    except Exception:  # an unreadable probe cache only costs the figure
        return None
    disk = getattr(probe, "disk", None)
    return getattr(disk, "read_gbs", None)
