"""The transcript: user messages, streamed assistant messages (Markdown) with a stats footer, notes."""

from __future__ import annotations

import re

from rich.cells import cell_len, chop_cells
from rich.segment import Segment
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Markdown, Static

__all__ = ["Transcript", "UserMessage", "AssistantMessage", "StreamTail", "Note", "wrap_cells"]
_WORDS = re.compile(r"\S+\s*|\s+")

TAIL_STEP = 6  # the streaming block's box starts this tall and at least doubles when it fills


class UserMessage(Static):
    """What the user sent (plain text, no markup)."""

    def __init__(self, text: str, *, queued: bool = False):
        super().__init__(text, markup=False, classes="queued" if queued else "")
        self.text = text

    def on_mount(self) -> None:
        self.border_title = "you"


def wrap_cells(line: str, width: int) -> list[str]:
    """Greedy word wrap of one line to `width` terminal cells (wide characters count 2)."""
    if width <= 0 or cell_len(line) <= width:
        return [line]
    out: list[str] = []
    cur, cur_w = "", 0
    for word in _WORDS.findall(line):
        w = cell_len(word)
        if cur_w + cell_len(word.rstrip()) <= width:
            cur, cur_w = cur + word, cur_w + w
            continue
        if cur:
            out.append(cur.rstrip())
        pieces = chop_cells(word, width) if cell_len(word.rstrip()) > width else [word]
        out.extend(pieces[:-1])
        cur = pieces[-1]
        cur_w = cell_len(cur)
    out.append(cur.rstrip())
    return out


class StreamTail(Widget):
    """The block being written, as plain text, drawn from cached Strips.

    Only the last logical line is re-wrapped and re-drawn when text arrives, so a frame
    costs the same however long the block is. The box starts TAIL_STEP rows tall and at
    least doubles when it fills: a change of height needs a layout pass, which reflows and
    repaints the whole screen, and stepping makes that happen a few times per block
    instead of on every frame (the unused rows show blank meanwhile)."""

    DEFAULT_CSS = """
    StreamTail { height: 0; }
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__(classes="tail")
        self.text = ""
        self._width = 0
        self._logical: list[list[str]] = []  # wrapped rows of each logical line
        self._rows: list[str] = []  # all wrapped rows, flattened
        self._strips: list[Strip | None] = []  # strip of row y, for rows drawn already (None: not yet)
        self._reserved = reserve  # height reserved now, rows
        self.styles.height = reserve

    def show(self, text: str) -> None:
        width = self.content_size.width or self.size.width or 80
        if width != self._width or not text.startswith(self.text):
            self._width, self.text, self._logical, self._rows, self._strips = width, "", [], [], []
            self.refresh()
        first_changed = self._append(text[len(self.text):])
        self.text = text
        del self._strips[first_changed:]  # rows from there on are drawn again
        n = len(self._rows) if text else 0
        reserved = self._reserved if 0 < n <= self._reserved else (n + max(TAIL_STEP, n) if n else 0)
        if reserved != self._reserved:
            self._reserved = reserved
            self.styles.height = reserved  # one layout pass
        elif n:
            self.refresh(Region(0, first_changed, width, max(1, n - first_changed)))

    def _append(self, new: str) -> int:
        """Extend the wrapped rows with `new` text (only the last logical line is wrapped
        again); return the first row that changed."""
        if not new:
            return len(self._rows)
        lines = new.split("\n")
        if self._logical:
            first_changed = len(self._rows) - len(self._logical[-1])
            del self._rows[first_changed:]
            self._logical[-1] = wrap_cells(self._logical_text_last() + lines[0], self._width)
        else:
            first_changed = 0
            self._logical.append(wrap_cells(lines[0], self._width))
        self._rows.extend(self._logical[-1])
        for line in lines[1:]:
            self._logical.append(wrap_cells(line, self._width))
            self._rows.extend(self._logical[-1])
        return first_changed

    def _logical_text_last(self) -> str:
        return self.text[self.text.rfind("\n") + 1 :]

    @property
    def row_count(self) -> int:
        """Wrapped rows written so far."""
        return len(self._rows)

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._reserved

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        strip = self._strips[y] if y < len(self._strips) else None
        if strip is None or strip.cell_length != width:
            style = self.rich_style
            text = self._rows[y] if y < len(self._rows) else ""
            strip = Strip([Segment(text, style)]).crop_extend(0, width, style)
            if y >= len(self._strips):
                self._strips.extend([None] * (y + 1 - len(self._strips)))
            self._strips[y] = strip
        return strip


class AssistantMessage(Vertical):
    """The model's answer. Whole blocks (up to a blank line) go to the Markdown as they
    complete, at most one append per frame; the block still being written shows as plain
    text below it (a Markdown append re-parses and re-lays-out the block it extends, which
    made every frame cost more as a paragraph grew). Then a one-line footer with the stats."""

    def __init__(self, initial: str = "", *, reserve_rows: int = TAIL_STEP) -> None:
        super().__init__()
        self.reserve_rows = reserve_rows  # rows held for the streaming block from the start
        self.text = initial  # everything received so far
        self._initial = initial
        self._tail_text = ""  # received, not yet handed to the Markdown (no blank line after it yet)
        self.finished = False

    def compose(self) -> ComposeResult:
        yield Markdown(self._initial, classes="answer")
        # A streaming answer starts with rows reserved (see Transcript.reserve_for): growing
        # the box means a layout pass, a 30-150 ms stall of the UI thread on a small machine.
        yield StreamTail(reserve=0 if self._initial else self.reserve_rows)
        yield Static("…", classes="footer", markup=False)

    def on_mount(self) -> None:
        self.border_title = "assistant"
        self._markdown = self.query_one(Markdown)
        self._tail = self.query_one(StreamTail)

    @property
    def tail(self) -> StreamTail:
        return self._tail

    async def append(self, text: str) -> None:
        """Take a batch of streamed text (called once per UI tick)."""
        if not text:
            return
        self.text += text
        tail = self._tail_text + text
        cut = tail.rfind("\n\n")
        if cut >= 0:  # whole blocks: the Markdown parses and lays out each block once
            await self._markdown.append(tail[: cut + 2])
            tail = tail[cut + 2 :]
        self._tail_text = tail
        self._tail.show(tail)

    async def finish(self, footer: str, finish_reason: str | None) -> None:
        """The answer is complete (or cancelled): all of it as Markdown, then the footer."""
        if self._tail_text:
            await self._markdown.append(self._tail_text)
            self._tail_text = ""
        self._tail.show("")  # also gives back the rows reserved for a stream that never came
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
    """Scrolls to the newest message while the user is at the bottom.

    While an answer streams, its box is sized once for the whole answer (max_tokens) and
    the view follows the last written row by scrolling, which repaints but needs no
    layout pass; anchoring to the bottom would show the reserved blank rows instead."""

    can_focus = False
    CHARS_PER_TOKEN = 4.5  # a generous estimate for sizing the streaming box
    MAX_RESERVE_ROWS = 400

    def on_mount(self) -> None:
        self.anchor()

    def reserve_for(self, max_tokens: int) -> int:
        """Rows to hold for an answer of up to max_tokens tokens at the current width."""
        width = max(10, self.scrollable_content_region.width - 8)  # the answer box's border and margins
        rows = -(-int(max_tokens * self.CHARS_PER_TOKEN) // width) + 1
        return max(TAIL_STEP, min(self.MAX_RESERVE_ROWS, rows))

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
