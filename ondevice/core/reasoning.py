"""Reasoning ("thinking") blocks: which markers a chat template uses, and where visible text starts.

Reasoning models write a hidden block before their answer (`<think>…</think>`). TTFT counts the
first token of that block; what a user waits for is the first *visible* token: the first output
text, not whitespace, outside every reasoning block. Both the in-process engine (text per token)
and the server bench (text per streamed chunk) answer it with `first_visible`, after the request,
so nothing runs per token.

A template "opens" the block when its generation prompt already ends with the open marker
(Qwen3 thinking, DeepSeek-R1 distills): the output then starts inside the block without writing
the marker. A close marker with no open marker before it means the same (a server whose template
did that), so a stream can be read right without knowing the template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ThinkMarkers", "KNOWN_MARKERS", "DEFAULT_MARKERS", "detect_markers", "opens_block", "first_visible"]


@dataclass(frozen=True)
class ThinkMarkers:
    open: str  # e.g. "<think>"
    close: str  # e.g. "</think>"
    starts_open: bool = False  # the generation prompt opened the block: output starts inside it


KNOWN_MARKERS = (
    ThinkMarkers("<think>", "</think>"),
    ThinkMarkers("<thinking>", "</thinking>"),
    ThinkMarkers("<seed:think>", "</seed:think>"),
    ThinkMarkers("<|begin_of_thought|>", "<|end_of_thought|>"),
    ThinkMarkers("◁think▷", "◁/think▷"),
)
DEFAULT_MARKERS = KNOWN_MARKERS[0]


def detect_markers(template: str | None) -> ThinkMarkers | None:
    """The reasoning markers a chat template's source names (both open and close), or None."""
    if not template:
        return None
    for m in KNOWN_MARKERS:
        if m.open in template and m.close in template:
            return m
    return None


def opens_block(rendered_prompt: str, markers: ThinkMarkers) -> bool:
    """Does a rendered generation prompt end inside a reasoning block (its last marker an open one)?"""
    text = rendered_prompt.rstrip()
    last_open, last_close = text.rfind(markers.open), text.rfind(markers.close)
    return last_open >= 0 and last_open > last_close and not text[last_open + len(markers.open) :].strip()


def first_visible(pieces: Sequence[str], markers: ThinkMarkers | None = DEFAULT_MARKERS) -> int | None:
    """Index of the first piece that carries visible text (not whitespace, outside reasoning blocks),
    or None when there is none (reasoning that never ended, or whitespace only).

    pieces: the output text as it arrived (one entry per token or per streamed chunk).
    markers None: every non-whitespace character is visible.
    """
    text = "".join(pieces)
    pos = _first_visible_char(text, markers)
    if pos is None:
        return None
    end = 0
    for i, piece in enumerate(pieces):
        end += len(piece)
        if pos < end:
            return i
    return None  # pragma: no cover - pos < len(text)


def _first_visible_char(text: str, m: ThinkMarkers | None) -> int | None:
    i, n = 0, len(text)
    if m is not None:
        first_close, first_open = text.find(m.close), text.find(m.open)
        if m.starts_open or (first_close >= 0 and (first_open < 0 or first_open > first_close)):
            if first_close < 0:
                return None  # still reasoning when the output ended
            i = first_close + len(m.close)
    while i < n:
        if m is not None and text.startswith(m.open, i):
            close = text.find(m.close, i + len(m.open))
            if close < 0:
                return None
            i = close + len(m.close)
            continue
        if m is not None and text.startswith(m.close, i):  # a stray close marker is not visible text
            i += len(m.close)
            continue
        if not text[i].isspace():
            return i if m is None or not m.open.startswith(text[i:]) else None  # a marker cut at the end
        i += 1
    return None
