"""Small text charts: a horizontal bar, and the ITL sparkline with a reference line."""

from __future__ import annotations

from typing import ClassVar, Sequence

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

__all__ = ["hbar", "ItlChart", "column_cells"]

_EIGHTHS = " ▁▂▃▄▅▆▇█"
_REF_CHAR = "─"


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


class ItlChart(Widget):
    """Per-token inter-token latencies, newest on the right; `─` marks the predicted step."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"itlchart--bar", "itlchart--slow", "itlchart--ref"}
    DEFAULT_CSS = """
    ItlChart { height: 3; }
    ItlChart > .itlchart--bar { color: $primary; }
    ItlChart > .itlchart--slow { color: $warning; }
    ItlChart > .itlchart--ref { color: $success; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._values: tuple[float, ...] = ()
        self._ref: float | None = None

    def set_data(self, values: Sequence[float], ref: float | None) -> None:
        """Show the newest values that fit; repaint only when something changed."""
        width = max(1, self.size.width or 40)
        n = len(values)
        new = tuple(values[i] for i in range(max(0, n - width), n))  # works for a deque too
        if new != self._values or ref != self._ref:
            self._values, self._ref = new, ref
            self.refresh()

    def render(self) -> Text:
        width, rows = max(1, self.size.width), max(1, self.size.height)
        values = self._values[-width:]
        if not values:
            return Text("waiting for tokens…", style="dim")
        styles = {
            "bar": self.get_component_rich_style("itlchart--bar"),
            "slow": self.get_component_rich_style("itlchart--slow"),
            "ref": self.get_component_rich_style("itlchart--ref"),
            "blank": Style(),
        }
        text = Text(no_wrap=True, overflow="crop")
        for n, line in enumerate(column_cells(values, self._ref, rows)):
            if n:
                text.append("\n")
            run_kind, run = None, []
            for char, kind in line + [("", None)]:  # one span per run of the same kind
                if kind != run_kind and run:
                    text.append("".join(run), styles[run_kind])
                    run = []
                run_kind = kind
                run.append(char)
        return text
