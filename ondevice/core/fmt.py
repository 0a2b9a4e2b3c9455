"""Text formatting of numbers and tables, shared by the CLI, the bench reports and the chat app.

One function per kind of figure: `millis` (a time in milliseconds), `rate` (tokens per
second), `human_bytes` (decimal units, as bandwidth is quoted), `binary_bytes` (binary units,
as memory is counted), `number` (any other figure). Callers that show a figure differently
say how by parameters (decimal places by size, the text for a missing value), not by a
formatter of their own.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DASH",
    "millis",
    "rate",
    "number",
    "human_bytes",
    "binary_bytes",
    "human_count",
    "age_text",
    "stats_footer",
    "table",
    "fold",
    "fold_lines",
    "layer_ranges",
]

DASH = "-"  # a figure that is missing (None, NaN, infinite)
ALWAYS_1 = ((math.inf, 1),)  # one decimal place at every size


def _missing(v: float | None) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _places(value: float, places: Sequence[tuple[float, int]]) -> int | None:
    """Decimal places for `value` from (below, places) steps, smallest first; None past the last."""
    return next((n for below, n in places if value < below), None)


def millis(
    seconds: float | None, *, places: Sequence[tuple[float, int]] = ALWAYS_1, unit: bool = True, missing: str = DASH
) -> str:
    """A time given in seconds, shown in milliseconds: "12.3 ms". places: (below this many ms,
    decimal places) steps, smallest first; at or past the last step it is shown in seconds, "12.3 s"."""
    if seconds is None or _missing(seconds):
        return missing
    ms = seconds * 1000.0
    n = _places(ms, places)
    if n is None:
        return f"{seconds:.1f} s"
    return f"{ms:.{n}f} ms" if unit else f"{ms:.{n}f}"


MS_CELL = ((10, 2), (1000, 1), (math.inf, 0))  # millis() places for three figures or so, under a header that says "ms"
MS_THEN_S = ((1000, 1),)  # millis() places: milliseconds below a second, then seconds ("0.8 ms", "1.5 s")


def ms_cell(seconds: float | None) -> str:
    """A time in seconds as a table cell under a header that says "ms" (three figures or so)."""
    return millis(seconds, places=MS_CELL, unit=False)


def rate(
    tok_s: float | None,
    *,
    places: Sequence[tuple[float, int]] = ALWAYS_1,
    missing: str = DASH,
    zero_is_missing: bool = False,
) -> str:
    """Tokens per second: "42.0 tok/s". places as for millis (past the last step: no decimals)."""
    if tok_s is None or _missing(tok_s) or (zero_is_missing and not tok_s):
        return missing
    n = _places(tok_s, places)
    return f"{tok_s:.{0 if n is None else n}f} tok/s"


def number(v: float | None, spec: str = ".1f", *, missing: str = DASH) -> str:
    """Any other figure, in a format spec (".2f", ".3g", ".0f"); `missing` for None, NaN or infinity."""
    return missing if _missing(v) else format(v, spec)


def _scaled(n: float, base: int, units: Sequence[str]) -> str:
    for unit in units:
        if abs(n) < base or unit == units[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= base
    raise AssertionError("unreachable")


def human_bytes(n: float | None, *, missing: str = "unknown") -> str:
    """Decimal units (MB, GB), as bandwidth in GB/s is quoted."""
    return missing if n is None else _scaled(n, 1000, ("B", "kB", "MB", "GB", "TB"))


def binary_bytes(n: float | None, *, missing: str = "unknown") -> str:
    """Binary units (MiB, GiB), as memory is counted."""
    return missing if n is None else _scaled(n, 1024, ("B", "KiB", "MiB", "GiB"))


def age_text(seconds: float) -> str:
    """Say how long ago: "3 hours ago", "1 day ago", "just now"."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


def human_count(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return str(int(n))


def stats_footer(stats: Mapping[str, Any] | None, finish_reason: str | None) -> str:
    """One line under a chat answer: TTFT, decode tok/s, tokens, cached prompt tokens, finish reason.
    stats: a stored message's stats (tui.live.generation_stats), or None; a figure that is not a
    finite number (a damaged store) is left out."""
    parts: list[str] = []
    stats = stats if isinstance(stats, Mapping) else {}
    timings = stats.get("timings")
    timings = timings if isinstance(timings, Mapping) else {}
    ttft_s, decode_tok_s = _figure(timings.get("ttft_s")), _figure(timings.get("decode_tok_s"))
    output_tokens, cached = _figure(timings.get("output_tokens")), _figure(stats.get("cached_prompt_tokens"))
    if ttft_s is not None:
        parts.append(f"TTFT {millis(ttft_s, places=((math.inf, 0),))}")
    if decode_tok_s:
        parts.append(rate(decode_tok_s))
    if output_tokens is not None:
        parts.append(f"{output_tokens} tok")
    if cached is not None:
        parts.append(f"{cached} cached")
    if finish_reason:
        parts.append(finish_reason)
    return " · ".join(parts)


def _figure(value: Any) -> float | None:
    """A finite number, or None (absent, or not a number)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


GAP = "  "  # between table columns
FOLD_FLOOR = 16  # a text column folds down to this many characters, no further


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    align: str | None = None,
    *,
    width: int | None = None,
    drop: Sequence[str] = (),
    whole: Sequence[str] = (),
    full: str | None = None,
) -> str:
    """A plain aligned text table. align: one char per column, 'l' (text) or 'r' (figures).

    width: the columns to fit in (None: no limit, every cell on one line). A table wider than
    that folds: headers at spaces, text cells onto more lines (not figures, nor the columns named in
    `whole`). When it still does not fit, whole columns are left out (those named in `drop` first,
    in that order, then from the right; never the first) and a last line names them and where the
    full table is (`full`, e.g. "--json")."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    align = align or "l" * len(headers)
    splits = [a != "r" and h not in whole for h, a in zip(headers, align)]  # cells that may fold
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    keep = list(range(len(headers)))
    if width is not None and _span(widths) > width:
        keep, widths = _fit(cells, splits, widths, width, [headers.index(h) for h in drop if h in headers])
    lines = []
    for n, row in enumerate(cells):
        parts = [_fold(row[i], w, split_words=n > 0 and splits[i]) for i, w in zip(keep, widths)]
        for k in range(max(len(p) for p in parts)):
            line = [(p[k] if k < len(p) else "") for p in parts]
            lines.append(
                GAP.join(c.rjust(w) if align[i] == "r" else c.ljust(w) for c, w, i in zip(line, widths, keep)).rstrip()
            )
        if n == 0:
            lines.append(GAP.join("-" * w for w in widths))
    left_out = [str(headers[i]) for i in range(len(headers)) if i not in keep]
    if left_out:
        where = f"; {full} has the full table" if full else ""
        columns = "1 column" if len(left_out) == 1 else f"{len(left_out)} columns"
        lines.append(fold(f"({columns} left out to fit {width}: {', '.join(left_out)}{where})", width, indent=""))
    return "\n".join(lines)


def fold(text: str, width: int | None, *, indent: str = "  ") -> str:
    """A line of prose on lines of at most `width` (None: as it is), the later ones indented."""
    if width is None or len(text) <= width:
        return text
    return "\n".join(textwrap.wrap(text, max(width, FOLD_FLOOR), subsequent_indent=indent, break_on_hyphens=False))


def fold_lines(text: str, width: int | None) -> str:
    """Each line of `text` longer than `width` folded (None: as it is), its later lines indented two
    more than it: a report's prose fits the terminal its tables fit."""
    if width is None:
        return text
    return "\n".join(fold(line, width, indent=" " * (len(line) - len(line.lstrip()) + 2)) for line in text.split("\n"))


def _span(widths: Sequence[int]) -> int:
    return sum(widths) + len(GAP) * (len(widths) - 1)


def _narrowest(cells: list[list[str]], i: int, splits: bool) -> int:
    """How narrow column i can fold: a header at spaces; text cells down to FOLD_FLOOR; other cells never."""
    header_word = max(map(len, cells[0][i].split()), default=0)
    if not splits:
        return max([header_word] + [len(r[i]) for r in cells[1:]])
    return max(header_word, min(max(len(r[i]) for r in cells), FOLD_FLOOR))


def _fit(
    cells: list[list[str]], splits: list[bool], widths: list[int], width: int, drop: list[int]
) -> tuple[list[int], list[int]]:
    """The columns kept and their widths: leave columns out until the narrowest folds fit (and
    take back, last left out first, those that fit again); then narrow the columns whose cells
    stay whole (only their headers fold: a line or two more in all), then the widest text columns
    (each row may take more lines), until the table fits."""
    narrowest = [_narrowest(cells, i, splits[i]) for i in range(len(widths))]
    keep = list(range(len(widths)))
    left_out = []
    for i in drop + [i for i in reversed(range(1, len(widths))) if i not in drop]:
        if _span([narrowest[k] for k in keep]) <= width or len(keep) == 1:
            break
        keep.remove(i)
        left_out.append(i)
    for i in reversed(left_out[:-1]):  # the last one left out was needed
        if _span([narrowest[k] for k in keep] + [narrowest[i]]) <= width:
            keep = sorted(keep + [i])
    fitted = {i: widths[i] for i in keep}
    excess = _span(list(fitted.values())) - width
    for folding_cells in (False, True):
        while excess > 0:
            foldable = [i for i in keep if fitted[i] > narrowest[i] and splits[i] == folding_cells]
            if not foldable:
                break
            fitted[max(foldable, key=lambda k: fitted[k])] -= 1
            excess -= 1
    return keep, [fitted[i] for i in keep]


def _fold(text: str, width: int, *, split_words: bool) -> list[str]:
    """A cell on lines of at most `width`, broken at spaces (and inside long words when split_words)."""
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=split_words, break_on_hyphens=False) or [""]


def layer_ranges(layers: Sequence[int]) -> str:
    """(0,1,2,4,5) -> '0-2, 4-5'."""
    out: list[str] = []
    start: int | None = None
    prev = 0  # set with start: read only once start is
    for i in layers:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(out)
