"""The transcript: user messages, streamed assistant messages (Markdown) with a stats footer, notes."""

from __future__ import annotations

from ondevice.tui.widgets.stream import STREAM_STEP, StreamingMarkdown
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
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
    """The model's answer. While it streams, a StreamingMarkdown shows it (finished blocks
    as Markdown, the block being written as plain text) in a box sized ahead, so no frame
    needs a layout pass; when it ends, the whole answer goes to a Textual Markdown (one
    layout pass, after the last token) and the streaming box gives its rows back. Then a
    one-line footer with the stats."""

    def __init__(self, initial: str = "", *, reserve_rows: int = STREAM_STEP) -> None:
        super().__init__()
        self.reserve_rows = reserve_rows  # rows held for the streaming answer from the start
        self.text = initial  # everything received so far
        self._initial = initial
        self.finished = False

    def compose(self) -> ComposeResult:
        streaming = not self._initial
        # While the answer streams, only the StreamingMarkdown is shown: every widget on
        # screen is drawn again on every frame, hidden ones are not.
        markdown = Markdown(self._initial, classes="answer")
        footer = Static("", classes="footer", markup=False)
        markdown.display = footer.display = not streaming
        yield markdown
        # A streaming answer starts with rows reserved (see Transcript.reserve_for): growing
        # the box means a layout pass, a 30-150 ms stall of the UI thread on a small machine.
        yield StreamingMarkdown(reserve=self.reserve_rows if streaming else 0)
        yield footer

    def on_mount(self) -> None:
        self.border_title = "assistant"
        self._markdown = self.query_one(Markdown)
        self._stream = self.query_one(StreamingMarkdown)

    @property
    def stream(self) -> StreamingMarkdown:
        return self._stream

    def append(self, text: str) -> None:
        """Take a batch of streamed text (called once per UI frame)."""
        if text:
            self.text += text
            self._stream.show(self.text)

    async def finish(self, footer: str, finish_reason: str | None) -> None:
        """The answer is complete (or cancelled): all of it as Markdown, then the footer."""
        if self.text != self._initial:
            await self._markdown.update(self.text)
        self._markdown.display = bool(self.text)
        self._stream.show("")  # gives back the rows reserved for the stream
        self.finished = True
        self.set_class(finish_reason == "cancelled", "cancelled")
        self.set_class(finish_reason == "error", "failed")
        footer_widget = self.query_one(".footer", Static)
        footer_widget.update(footer or (finish_reason or ""))
        footer_widget.display = True


class Note(Static):
    """A line the app writes into the transcript (turns dropped, load status, errors)."""

    def __init__(self, text: str, *, kind: str = "info"):
        super().__init__(text, markup=False, classes=f"note note-{kind}")
        self.text = text


class Transcript(VerticalScroll):
    """Scrolls to the newest message while the user is at the bottom.

    While an answer streams, its box is sized once for the whole answer (max_tokens) and
    the view follows the last written row by scrolling, which repaints but needs no
    layout pass; anchoring to the bottom would show the reserved blank rows instead."""

    can_focus = False
    CHARS_PER_TOKEN = 6.5  # for sizing the streaming box: English text runs 4-5 characters a token, the rest
    # pays for word wrap and the blank rows between paragraphs
    MAX_RESERVE_ROWS = 400

    def on_mount(self) -> None:
        self.anchor()

    def reserve_for(self, max_tokens: int) -> int:
        """Rows to hold for an answer of up to max_tokens tokens at the current width."""
        width = max(10, self.scrollable_content_region.width - 8)  # the answer box's border and margins
        rows = -(-int(max_tokens * self.CHARS_PER_TOKEN) // width) + 1
        return max(STREAM_STEP, min(self.MAX_RESERVE_ROWS, rows))

    def follow(self, widget: Widget, row: int, since_y: float | None) -> float | None:
        """Scroll so `row` of `widget` is in view at the bottom. Returns the scroll offset to
        pass back next time, or None once the user has scrolled up (then stop following)."""
        if since_y is not None and self.scroll_y < since_y - 0.5:
            return None
        y = widget.region.y - self.scrollable_content_region.y + round(self.scroll_y) + row
        height = self.scrollable_content_region.height
        if y >= self.scroll_y + height:
            self.scroll_to(y=y - height + 1, animate=False, immediate=True)
        return self.scroll_y

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
