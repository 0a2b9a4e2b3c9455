"""Token bytes -> releasable text: whole UTF-8 characters only, stop strings never emitted.

A token's piece may end inside a multi-byte character (byte-fallback vocabularies
split them), and a stop string may span several tokens. `TextAssembler.push` takes one
token's bytes and returns the text that is safe to show now: an incomplete UTF-8
sequence is held back until it completes, and so is any tail that could still turn
into a stop string. When a stop string completes, the text before it is released, the
stop string itself never is, and `stopped` is set.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["TextAssembler"]


class TextAssembler:
    """Incremental UTF-8 decoding plus stop-string matching across token boundaries."""

    __slots__ = ("_decoder", "_stops", "_max_hold", "_pending", "stopped", "stop_string")

    def __init__(self, stop: Sequence[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = tuple(stop)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1  # longest tail worth holding
        self._pending = ""  # decoded text held back: it may start a stop string
        self.stopped = False  # a stop string has completed
        self.stop_string: str | None = None  # which one

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that can be released now."""
        if self.stopped:
            return ""
        text = self._pending + self._decoder.decode(piece)
        if not self._stops:
            return text
        return self._scan(text)

    def flush(self) -> str:
        """End of output: release what is held (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if not self._stops:
            return text
        released = self._scan(text)
        if not self.stopped:
            released += self._pending
            self._pending = ""
        return released

    @property
    def held(self) -> str:
        """Decoded text currently held back (a possible stop-string start)."""
        return self._pending

    def _scan(self, text: str) -> str:
        hit, which = -1, None
        for s in self._stops:
            i = text.find(s)
            if i >= 0 and (hit < 0 or i < hit):
                hit, which = i, s
        if hit >= 0:
            self.stopped, self.stop_string, self._pending = True, which, ""
            return text[:hit]
        keep = self._held_tail(text)
        self._pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _held_tail(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        window = max(0, len(text) - self._max_hold)
        best = 0
        for s in self._stops:
            i = text.find(s[0], window)
            while i >= 0:  # the first hit is this stop's longest tail
                if s.startswith(text[i:]):
                    best = max(best, len(text) - i)
                    break
                i = text.find(s[0], i + 1)
        return best
