"""The transcript: user messages, streamed assistant messages (Markdown) with a stats footer, notes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

__all__ = ["Transcript", "UserMessage", "AssistantMessage", "Note"]


class UserMessage(Static):
    """What the user sent (plain text, no markup)."""

    def __init__(self, text: str, *, queued: bool = False):
        super().__init__(text, markup=False, classes="queued" if queued else "")
        self.text = text

    def on_mount(self) -> None:
        self.border_title = "you"


class AssistantMessage(Vertical):
    """The model's answer: Markdown appended in batches, then a one-line footer."""

    def __init__(self, initial: str = "") -> None:
        super().__init__()
        self.text = initial
        self._initial = initial
        self.finished = False

    def compose(self) -> ComposeResult:
        yield Markdown(self._initial, classes="answer")
        yield Static("…", classes="footer", markup=False)

    def on_mount(self) -> None:
        self.border_title = "assistant"

    async def append(self, text: str) -> None:
        """Append a batch of streamed text (one Markdown append per UI tick)."""
        if not text:
            return
        self.text += text
        await self.query_one(Markdown).append(text)

    def finish(self, footer: str, finish_reason: str | None) -> None:
        self.finished = True
        self.set_class(finish_reason == "cancelled", "cancelled")
        self.set_class(finish_reason == "error", "failed")
        self.query_one(".footer", Static).update(footer or (finish_reason or ""))


class Note(Static):
    """A line the app writes into the transcript (turns dropped, load status, errors)."""

    def __init__(self, text: str, *, kind: str = "info"):
        super().__init__(text, markup=False, classes=f"note note-{kind}")
        self.text = text


class Transcript(VerticalScroll):
    """Scrolls to the newest message while the user is at the bottom."""

    can_focus = False

    def on_mount(self) -> None:
        self.anchor()

    async def add_user(self, text: str, *, queued: bool = False) -> UserMessage:
        widget = UserMessage(text, queued=queued)
        await self.mount(widget)
        return widget

    async def add_assistant(self, initial: str = "") -> AssistantMessage:
        widget = AssistantMessage(initial)
        await self.mount(widget)
        return widget

    async def add_note(self, text: str, kind: str = "info") -> Note:
        widget = Note(text, kind=kind)
        await self.mount(widget)
        return widget

    async def clear(self) -> None:
        await self.remove_children()
