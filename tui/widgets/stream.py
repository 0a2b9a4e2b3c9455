"""The answer while it streams: one widget, drawn from cached Strips, that never needs a layout pass.

Finished blocks (up to a blank line outside a code fence) are Markdown: Rich renders each
batch of them once, when its blank line arrives. The block still being written is plain
text, wrapped incrementally (only its last line is wrapped again when text arrives). The
box is sized ahead (rows reserved) and grows in steps, because a change of height means a
layout pass: a full reflow and repaint that stalls the UI thread for 100 ms or more on a
small machine, and on a machine whose cores all decode, it stalls decoding with it.
"""

from __future__ import annotations

import bisect
import re

from rich.cells import cell_len, chop_cells
from rich.markdown import Markdown
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

__all__ = ["StreamingMarkdown", "STREAM_STEP", "finished_blocks_end", "wrap_cells"]

STREAM_STEP = 6  # the box grows by at least this many rows (at least doubling) when it fills
_WORDS = re.compile(r"\S+\s*|\s+")
_PLAIN = {c: None for c in (*range(0, 9), *range(11, 32), 127)} | {9: "    "}  # drop control codes, tabs as 4 spaces
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)", re.MULTILINE)


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


def finished_blocks_end(text: str) -> int:
    """Length of the leading part of `text` made of finished Markdown blocks: up to and
    including the last blank line that is not inside a code fence (0 if there is none).
    `text` must start outside a fence."""
    fences = [m.start() for m in _FENCE.finditer(text)]
    cut = len(text)
    while (cut := text.rfind("\n\n", 0, cut)) >= 0:
        if bisect.bisect_left(fences, cut) % 2 == 0:  # an even number of fence lines before it
            return cut + 2
    return 0


class StreamingMarkdown(Widget):
    """An answer as it streams (see the module docstring). `show(text)` with the whole text
    so far; the widget works out what is new."""

    DEFAULT_CSS = """
    StreamingMarkdown { height: 0; }
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__(classes="stream")
        self.text = ""  # everything shown so far
        self._width = 0  # cells the rows were made for
        self._done_chars = 0  # len of the leading part of text that is finished blocks
        self._done: list[Strip] = []  # rows of the finished blocks, Markdown, a blank row after each batch
        self._logical: list[list[str]] = []  # wrapped rows of each line of the open block
        self._last_line = ""  # the open block's last line (the one text is arriving on)
        self._rows: list[str] = []  # the open block's rows, flattened
        self._strips: list[Strip | None] = []  # strip of each open-block row drawn already (None: not yet)
        self._reserved = reserve  # height reserved now, rows
        self._style: Style | None = None  # the widget's rich style (costly to look up each time)
        self._style_stale = False  # the CSS changed since: look the style up again
        self.styles.height = reserve

    def notify_style_update(self) -> None:
        self._style_stale = True
        super().notify_style_update()

    def _base_style(self) -> Style:
        if self._style is None or self._style_stale:
            style, self._style_stale = self.rich_style, False
            if self._style is not None and style != self._style:  # a new theme: draw everything again
                self._width, self._strips = 0, []
            self._style = style
        return self._style

    @property
    def row_count(self) -> int:
        """Rows written so far (finished blocks and the open block)."""
        return len(self._done) + len(self._rows)

    @property
    def open_text(self) -> str:
        """The block still being written (plain text)."""
        return self.text[self._done_chars :]

    def show(self, text: str) -> None:
        self._base_style()  # (a changed style resets the width: everything is drawn again)
        width = self.content_size.width or self.size.width or 80
        if width != self._width or not text.startswith(self.text):
            self._reset(width)
        first_changed = self._take(text)
        n = self.row_count if text else 0
        reserved = self._reserved if 0 < n <= self._reserved else (n + max(STREAM_STEP, n) if n else 0)
        if reserved != self._reserved:
            self._reserved = reserved
            self.styles.height = reserved  # one layout pass
        elif n and first_changed < n:
            self.refresh(Region(0, first_changed, width, n - first_changed))

    def _reset(self, width: int) -> None:
        self._width, self.text, self._done_chars = width, "", 0
        self._done, self._logical, self._rows, self._strips, self._last_line = [], [], [], [], ""
        self.refresh()

    def _take(self, text: str) -> int:
        """Show `text` (which extends self.text); return the first row that changed."""
        new = text[len(self.text) :]
        self.text = text
        first_changed = self.row_count - (len(self._logical[-1]) if self._logical else 0)
        end = finished_blocks_end(self.text[self._done_chars :])
        if end:  # blocks finished: the open block's rows give way to their Markdown
            first_changed = len(self._done)
            self._done += self._markdown_rows(self.text[self._done_chars : self._done_chars + end])
            self._done_chars += end
            self._logical, self._rows, self._strips, self._last_line = [], [], [], ""
            new = self.text[self._done_chars :]
        self._append_plain(new)
        del self._strips[max(0, first_changed - len(self._done)) :]
        return first_changed

    def _markdown_rows(self, blocks: str) -> list[Strip]:
        """Finished blocks as Markdown rows, then one blank row (a paragraph's margin)."""
        if not blocks.strip():
            return []
        console = self.app.console
        options = console.options.update_width(self._width)
        code_theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        style = self._base_style()
        lines = console.render_lines(Markdown(blocks.strip("\n"), code_theme=code_theme), options, style=style)
        blank = Strip([Segment(" " * self._width, style)], self._width)
        return [Strip(line).crop_extend(0, self._width, style) for line in lines] + [blank]

    def _append_plain(self, new: str) -> None:
        """Extend the open block's wrapped rows with `new` text: only its last line is
        wrapped again."""
        if not new:
            return
        lines = new.translate(_PLAIN).split("\n")
        if self._logical:
            del self._rows[len(self._rows) - len(self._logical[-1]) :]
            self._last_line += lines[0]
            self._logical[-1] = wrap_cells(self._last_line, self._width)
        else:
            self._last_line = lines[0]
            self._logical.append(wrap_cells(self._last_line, self._width))
        self._rows.extend(self._logical[-1])
        for line in lines[1:]:
            self._last_line = line
            self._logical.append(wrap_cells(line, self._width))
            self._rows.extend(self._logical[-1])

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._reserved

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y < len(self._done):  # (resized since: cut or padded until the next show() draws it again)
            strip = self._done[y]
            return strip if strip.cell_length == width else strip.crop_extend(0, width, self._base_style())
        y -= len(self._done)
        strip = self._strips[y] if y < len(self._strips) else None
        if strip is None or strip.cell_length != width:
            style = self._base_style()
            text = self._rows[y] if y < len(self._rows) else ""
            strip = Strip([Segment(text, style)]).crop_extend(0, width, style)
            if y >= len(self._strips):
                self._strips.extend([None] * (y + 1 - len(self._strips)))
            self._strips[y] = strip
        return strip
