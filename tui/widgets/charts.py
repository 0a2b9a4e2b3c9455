"""Cheap text drawing for the live panel: styled lines kept as ready Strips, the ITL sparkline
with a reference line, and a horizontal bar.

The panel repaints up to 10 times a second while tokens stream, so its widgets draw from
cached Strips (built once per change) instead of going through a Static's text pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

__all__ = ["hbar", "column_cells", "plain_text", "StyledLines", "ItlChartRows", "Run", "Line"]

_EIGHTHS = " ▁▂▃▄▅▆▇█"
_REF_CHAR = "─"

Run = tuple[str, "str | None"]  # text, and a style name from StyledLines.COMPONENT_CLASSES (None: plain)
Line = tuple[Run, ...]


def hbar(fraction: float | None, width: int) -> str:
    """A bar of `width` cells filled to `fraction` (clamped to 0..1), in eighths."""
    width = max(0, int(width))
    if fraction is None or fraction != fraction:  # None or NaN
        return "·" * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    return ("█" * full + partial).ljust(width, "░")[:width]


def column_cells(values: Sequence[float], ref: float | None, rows: int) -> list[list[tuple[str, str]]]:
    """Cells of a bar chart, top row first: (char, kind) with kind in bar/slow/ref/blank.

    Each value is one column, scaled so the tallest value (or the reference, if higher)
    fills `rows` rows. A column more than 10% above the reference is "slow". The row
    holding the reference level is drawn in the reference colour: `─` where the bar does
    not reach it, the bar's own glyph where it does, so the line stays visible.
    """
    rows = max(1, rows)
    top = max([v for v in values if v > 0] + [ref or 0.0]) * 1.05
    if top <= 0:
        return [[(" ", "blank") for _ in values] for _ in range(rows)]
    heights = [max(1, round(v / top * rows * 8)) if v > 0 else 0 for v in values]
    ref_eighths = ref / top * rows * 8 if ref else None
    ref_level = min(rows - 1, int(ref_eighths // 8)) if ref_eighths is not None else None
    grid: list[list[tuple[str, str]]] = []
    for r in range(rows):
        level = rows - 1 - r  # 0 = bottom row
        line = []
        for v, h in zip(values, heights):
            fill = max(0, min(8, h - level * 8))
            slow = ref is not None and v > ref * 1.1
            if level == ref_level:  # the reference row: a band in the reference colour
                line.append((_REF_CHAR if fill == 0 else _EIGHTHS[fill], "ref"))
            elif fill:
                line.append((_EIGHTHS[fill], "slow" if slow else "bar"))
            else:
                line.append((" ", "blank"))
        grid.append(line)
    return grid


def plain_text(lines: Sequence[Line]) -> str:
    """Lines of runs as text, without styles."""
    return "\n".join("".join(text for text, _ in line) for line in lines)


def runs(cells: Sequence[tuple[str, str]]) -> Line:
    """Merge neighbouring cells of the same kind into runs ("blank" -> plain)."""
    out: list[Run] = []
    for char, kind in cells:
        style = None if kind == "blank" else kind
        if out and out[-1][1] == style:
            out[-1] = (out[-1][0] + char, style)
        else:
            out.append((char, style))
    return tuple(out)


class StyledLines(Widget):
    """Lines of styled runs, drawn from Strips cached until the lines or the theme change."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "lines--gauge",
        "lines--warn",
        "lines--full",
        "lines--bar",
        "lines--slow",
        "lines--ref",
        "lines--dim",
        "lines--muted",
    }
    DEFAULT_CSS = """
    StyledLines { height: auto; }
    StyledLines > .lines--gauge { color: $success; }
    StyledLines > .lines--warn { color: $warning; }
    StyledLines > .lines--full { color: $error; text-style: bold; }
    StyledLines > .lines--bar { color: $primary; }
    StyledLines > .lines--slow { color: $warning; }
    StyledLines > .lines--ref { color: $success; }
    StyledLines > .lines--dim { text-style: dim; }
    StyledLines > .lines--muted { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._lines: tuple[Line, ...] = ()
        self._strips: list[Strip] | None = None  # built on the next paint
        self._styles: dict[str | None, Style] | None = None

    def set_lines(self, lines: Sequence[Sequence[Run]]) -> None:
        """Show these lines; repaint only the lines that differ from what is shown."""
        new = tuple(tuple(line) for line in lines)
        old, self._lines = self._lines, new
        if new == old:
            return
        width = self.size.width
        if self._strips is None or len(old) != len(new) or not width:
            self._strips = None
            self.refresh()
            return
        changed = [y for y, (was, now) in enumerate(zip(old, new)) if was != now]
        for y in changed:
            self._strips[y] = self._strip(new[y], width)
        self.refresh(*(Region(0, y, width, 1) for y in changed))

    def notify_style_update(self) -> None:
        self._styles, self._strips = None, None
        super().notify_style_update()

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines)

    def _style(self, name: str | None) -> Style:
        if self._styles is None:
            base = self.rich_style
            self._styles = {None: base}
            for cls in self.COMPONENT_CLASSES:
                self._styles[cls.removeprefix("lines--")] = base + self.get_component_rich_style(cls, partial=True)
        return self._styles.get(name, self._styles[None])

    def _strip(self, line: Line, width: int) -> Strip:
        return Strip([Segment(text, self._style(style)) for text, style in line]).crop_extend(
            0, width, self._style(None)
        )

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or (self._strips and self._strips[0].cell_length != width):
            self._strips = [self._strip(line, width) for line in self._lines]
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self._style(None))


class ItlChartRows:
    """The ITL sparkline's rows: per-token gaps, newest on the right, as many as fit; the
    band marks the predicted step. Remembers what it drew, so an unchanged chart is the
    same list (and repaints nothing)."""

    ROWS = 3
    WAITING: tuple[Line, ...] = ((("waiting for tokens…", "dim"),),)

    def __init__(self) -> None:
        self.values: tuple[float, ...] = ()  # the gaps drawn, seconds, oldest first
        self.ref: float | None = None  # the predicted step drawn, seconds
        self._width = 0  # columns drawn
        self._lines: list[Line] = list(self.WAITING)

    def lines(self, values: Sequence[float], ref: float | None, width: int) -> list[Line]:
        n = len(values)
        new = tuple(values[i] for i in range(max(0, n - width), n))  # works for a deque too
        if (new, ref, width) != (self.values, self.ref, self._width):
            self.values, self.ref, self._width = new, ref, width
            self._lines = [runs(row) for row in column_cells(new, ref, self.ROWS)] if new else list(self.WAITING)
        return self._lines
