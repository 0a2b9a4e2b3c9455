"""What the main screen's workers post to it (messages up), and what it tells the app.

Handled as `on_chat_screen_<name>` (the namespace keeps the handlers' names as if the
classes were nested in ChatScreen). Loaded, TaskDone, TurnDropped and TurnDone go to the
screen only; ModelNamed bubbles up to the app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ondevice.tui.controller import LoadResult, Turn
from ondevice.tui.session import TurnResult
from textual.message import Message

__all__ = ["Loaded", "ModelNamed", "TaskDone", "TaskThen", "TurnDone", "TurnDropped"]

TaskThen = Callable[[str | None], Any]  # called with the task's error (or None) when it ends


class Loaded(Message, bubble=False, namespace="chat_screen"):
    """The load worker ended (with an engine and a session, or an error)."""

    def __init__(self, result: LoadResult) -> None:
        super().__init__()
        self.result = result


class TaskDone(Message, bubble=False, namespace="chat_screen"):
    """An engine task (new chat, restore, settings) ended."""

    def __init__(self, then: TaskThen | None, error: str | None) -> None:
        super().__init__()
        self.then, self.error = then, error


class TurnDropped(Message, bubble=False, namespace="chat_screen"):
    """The oldest n turns left the context so that `turn` fits."""

    def __init__(self, turn: Turn, n: int) -> None:
        super().__init__()
        self.turn, self.n = turn, n


class TurnDone(Message, bubble=False, namespace="chat_screen"):
    """The generation worker ended: a result, or an error."""

    def __init__(self, turn: Turn, result: TurnResult | None, error: str | None) -> None:
        super().__init__()
        self.turn, self.result, self.error = turn, result, error


class ModelNamed(Message, namespace="chat_screen"):
    """The model is loaded and this is its name (bubbles up to the app)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
