"""Text formatting of numbers and tables, shared by the CLI, the bench reports and the chat app.

One function per kind of figure: `millis` (a time in milliseconds), `rate` (tokens per
second), `human_bytes` (decimal units, as bandwidth is quoted), `binary_bytes` (binary units,
as memory is counted), `number` (any other figure). Callers that show a figure differently
say how by parameters (decimal places by size, the text for a missing value), not by a
formatter of their own.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["DASH", "millis", "rate", "number", "human_bytes", "binary_bytes", "human_count", "stats_footer", "table",
           "layer_ranges"]

DASH = "-"  # a figure that is missing (None, NaN, infinite)
ALWAYS_1 = ((math.inf, 1),)  # one decimal place at every size


def _missing(v: float | None) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _places(value: float, places: Sequence[tuple[float, int]]) -> int | None:
    """Decimal places for `value` from (below, places) steps, smallest first; None past the last."""
    return next((n for below, n in places if value < below), None)


def millis(seconds: float | None, *, places: Sequence[tuple[float, int]] = ALWAYS_1, unit: bool = True,
           missing: str = DASH) -> str:
    """A time given in seconds, shown in milliseconds: "12.3 ms". places: (below this many ms,
    decimal places) steps, smallest first; at or past the last step it is shown in seconds, "12.3 s"."""
    if _missing(seconds):
        return missing
    ms = seconds * 1000.0
    n = _places(ms, places)
    if n is None:
        return f"{seconds:.1f} s"
    return f"{ms:.{n}f} ms" if unit else f"{ms:.{n}f}"


def rate(tok_s: float | None, *, places: Sequence[tuple[float, int]] = ALWAYS_1, missing: str = DASH,
         zero_is_missing: bool = False) -> str:
    """Tokens per second: "42.0 tok/s". places as for millis (past the last step: no decimals)."""
    if _missing(tok_s) or (zero_is_missing and not tok_s):
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


def human_count(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return str(int(n))


def stats_footer(stats: Mapping[str, Any] | None, finish_reason: str | None) -> str:
    """One line under a chat answer: TTFT, decode tok/s, tokens, cached prompt tokens, finish reason.
    stats: a stored message's stats (tui.live.generation_stats), or None."""
    parts: list[str] = []
    timings = (stats or {}).get("timings") or {}
    if timings.get("ttft_s") is not None:
        parts.append(f"TTFT {millis(timings['ttft_s'], places=((math.inf, 0),))}")
    if timings.get("decode_tok_s"):
        parts.append(rate(timings["decode_tok_s"]))
    if timings.get("output_tokens") is not None:
        parts.append(f"{timings['output_tokens']} tok")
    if stats and stats.get("cached_prompt_tokens") is not None:
        parts.append(f"{stats['cached_prompt_tokens']} cached")
    if finish_reason:
        parts.append(finish_reason)
    return " · ".join(parts)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A plain aligned text table. align: one char per column, 'l' or 'r'."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" * len(headers)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def layer_ranges(layers: Sequence[int]) -> str:
    """(0,1,2,4,5) -> '0-2, 4-5'."""
    out: list[str] = []
    start = prev = None
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
