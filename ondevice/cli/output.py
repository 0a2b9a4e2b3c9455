"""What the CLI writes besides plain text: JSON on stdout, a progress line on stderr; the width tables fit."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

__all__ = ["dump_json", "ProgressLine", "terminal_width"]


def terminal_width() -> int | None:
    """The columns of the terminal stdout shows in (tables fit it); None when stdout is a pipe or a
    file, which get every table whole."""
    return shutil.get_terminal_size().columns if _stdout_is_terminal() else None


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def dump_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


class ProgressLine:
    """One self-overwriting status line on stderr, only when stderr is a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.shown = False

    def __call__(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False
