"""Text that can be encoded as UTF-8: what reaches the tokenizer, the history and the terminal.

Python lets a `str` hold lone surrogates: bytes that were not UTF-8, smuggled through argv,
stdin or file names as U+DC80..U+DCFF ("surrogateescape"), or half of a UTF-16 pair from a
Windows console or a careless caller. Such a string cannot be encoded as UTF-8. Invalid
input becomes U+FFFD, the replacement character, as llama.cpp's own tokenizer does with
invalid UTF-8 bytes (unicode_cpts_from_utf8) and as our detokenizer does with its output.
"""

from __future__ import annotations

import re

__all__ = ["clean_text", "decode_utf8", "printable"]

_SURROGATES = re.compile("[\ud800-\udfff]+")
_REPLACEMENT = "\ufffd".encode("utf-8")
# C0 and C1 controls and DEL: ESC starts terminal escape sequences, CR/BEL/newline rewrite the line
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    """`text` that encodes as UTF-8: a UTF-16 surrogate pair becomes its character, a run of
    surrogate-escaped bytes is decoded as UTF-8 (invalid bytes becoming U+FFFD), any other
    surrogate becomes U+FFFD. Text without surrogates is returned as it is."""
    return _SURROGATES.sub(_replace_run, text) if _SURROGATES.search(text) else text


def printable(text: str) -> str:
    """`text` safe to print on one terminal line: every control character (ESC, CR, BEL, newline,
    tab, C1 controls) becomes U+FFFD, so a name from a file or a server cannot move the cursor,
    recolour the terminal or forge a line. For strings that came from outside the program."""
    return _CONTROLS.sub("\ufffd", clean_text(str(text)))


def decode_utf8(data: bytes) -> str:
    """Bytes -> text, invalid UTF-8 becoming U+FFFD."""
    return data.decode("utf-8", "replace")


def _replace_run(match: re.Match[str]) -> str:
    run, raw, i = match.group(), bytearray(), 0
    while i < len(run):
        code = ord(run[i])
        low = ord(run[i + 1]) if i + 1 < len(run) else 0
        if 0xD800 <= code <= 0xDBFF and 0xDC00 <= low <= 0xDFFF:  # a UTF-16 pair (surrogateescape makes no high half)
            raw += chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)).encode("utf-8")
            i += 2
            continue
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte it stands for
            raw.append(code - 0xDC00)
        else:
            raw += _REPLACEMENT
        i += 1
    return decode_utf8(bytes(raw))
