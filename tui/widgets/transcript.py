"""The transcript: user messages, streamed assistant messages (Markdown) with a stats footer, notes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Markdown, Static

__all__ = ["Transcript", "UserMessage", "AssistantMessage", "StreamTail", "Note"]

TAIL_STEP = 4  # the streaming line's box grows by this many lines at a time


class UserMessage(Static):
    """What the user sent (plain text, no markup)."""

    def __init__(self, text: str, *, queued: bool = False):
        super().__init__(text, markup=False, classes="queued" if queued else "")
        self.text = text

    def on_mount(self) -> None:
        self.border_title = "you"


class StreamTail(Static):
    """The line being written, as plain text, in a box whose height grows in steps.

    A change of height needs a layout pass, which reflows and repaints the whole screen;
    growing by TAIL_STEP lines at a time makes that happen once every few wrapped lines
    instead of on every tick (the unused lines show blank until the line completes)."""

    def __init__(self) -> None:
        super().__init__("", markup=False, classes="tail")
        self._rows = 0  # height reserved now, lines

    def show(self, text: str) -> None:
        width = self.content_size.width or self.size.width
        lines = (len(Content(text).wrap(width)) if width > 0 else 1) if text else 0
        rows = self._rows if 0 < lines <= self._rows else (lines + TAIL_STEP - 1 if lines else 0)
        if rows != self._rows:
            self._rows = rows
            self.styles.height = rows  # one layout pass
        self.update(text, layout=False)


class AssistantMessage(Vertical):
    """The model's answer. Whole lines go to the Markdown as they complete (one append per
    UI tick at most); the line still being written shows as plain text below it. Then a
    one-line footer with the message's stats."""

    def __init__(self, initial: str = "") -> None:
        super().__init__()
        self.text = initial  # everything received so far
        self._initial = initial
        self._tail_text = ""  # received, not yet handed to the Markdown (no newline yet)
        self.finished = False

    def compose(self) -> ComposeResult:
        yield Markdown(self._initial, classes="answer")
        yield StreamTail()
        yield Static("…", classes="footer", markup=False)

    def on_mount(self) -> None:
        self.border_title = "assistant"
        self._markdown = self.query_one(Markdown)
        self._tail = self.query_one(StreamTail)

    async def append(self, text: str) -> None:
        """Take a batch of streamed text (called once per UI tick)."""
        if not text:
            return
        self.text += text
        tail = self._tail_text + text
        cut = tail.rfind("\n")
        if cut >= 0:
            await self._markdown.append(tail[: cut + 1])
            tail = tail[cut + 1 :]
        self._tail_text = tail
        self._tail.show(tail)

    async def finish(self, footer: str, finish_reason: str | None) -> None:
        """The answer is complete (or cancelled): all of it as Markdown, then the footer."""
        if self._tail_text:
            await self._markdown.append(self._tail_text)
            self._tail_text = ""
            self._tail.show("")
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
