"""One progress display for every long command: a self-overwriting bar with the fraction done and an
estimate of the time left on a terminal, plain lines (one per tenth of the work) when the stream is not one.

The library reports progress through callbacks (done, total); the CLI turns them into this display."""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

__all__ = ["ProgressBar", "StepProgress", "StatusLine", "step_progress", "eta_text", "resolve_model_with_bar"]

BAR_CELLS = 20
PLAIN_STEPS = 10  # plain lines: one each time another tenth of the work is done


def eta_text(seconds: float | None) -> str:
    """'ETA 1:05' (minutes:seconds), 'ETA 1:02:05' past an hour, 'ETA --' when not known yet."""
    if seconds is None:
        return "ETA --"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"ETA {hours}:{minutes:02d}:{secs:02d}" if hours else f"ETA {minutes}:{secs:02d}"


class _Display:
    """What every display here holds: its label, the stream it writes to (stderr), a clock (seconds, injectable
    for tests), and whether the stream is a terminal (a line rewritten in place) or a log (a line per event)."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        terminal: bool | None = None,
    ):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.terminal = self.stream.isatty() if terminal is None else terminal


class ProgressBar(_Display):
    """Call with (done, total) as work advances; close() when it ends. The time left is the elapsed time
    scaled by the share still to do (clock: seconds, injectable for tests)."""

    def __init__(self, label: str, **display: Any):
        super().__init__(label, **display)
        self.started_s = self.clock()
        self._plain_step = -1
        self._shown = False

    def text(self, done: int, total: int) -> str:
        share = min(1.0, done / total) if total > 0 else 0.0
        filled = round(share * BAR_CELLS)
        elapsed_s = self.clock() - self.started_s
        left_s = elapsed_s * (1 - share) / share if share > 0 else None
        bar = "#" * filled + "-" * (BAR_CELLS - filled)
        return f"{self.label} [{bar}] {done}/{total} {share:4.0%} {eta_text(left_s)}"

    def __call__(self, done: int, total: int) -> None:
        if self.terminal:
            self.stream.write("\r\033[K" + self.text(done, total))
            self._shown = True
        else:
            step = int(PLAIN_STEPS * done / total) if total > 0 else 0
            if step <= self._plain_step:
                return
            self._plain_step = step
            self.stream.write(self.text(done, total) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Clear the bar from the terminal (plain lines stay)."""
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False


STEP_TEXT = 40  # characters of a step's description a bar shows (the bar stays on one terminal line)


class StepProgress(_Display):
    """A display for the library's step events (.done, .total, .description: the bench's and the probe's):
    on a terminal one ProgressBar labelled with the step now running, with the time left; otherwise one
    plain line per step ("[3/40] description"), as a log wants."""

    def __init__(self, label: str, **display: Any):
        super().__init__(label, **display)
        self._bar = ProgressBar(label, stream=self.stream, clock=self.clock, terminal=True) if self.terminal else None

    def __call__(self, event: Any) -> None:
        if self._bar is None:
            self.stream.write(f"[{event.done}/{event.total}] {event.description}\n")
            self.stream.flush()
            return
        step = str(event.description)
        step = step if len(step) <= STEP_TEXT else step[: STEP_TEXT - 3] + "..."
        self._bar.label = f"{self.label}: {step}"
        self._bar(event.done, event.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextlib.contextmanager
def step_progress(label: str, *, enabled: bool = True) -> Iterator[StepProgress | None]:
    """A StepProgress on stderr for the length of the block (cleared at its end, an error's included); None
    when disabled (--no-progress)."""
    if not enabled:
        yield None
        return
    display = StepProgress(label)
    try:
        yield display
    finally:
        display.close()


def resolve_model_with_bar(ref: Any, *, stream: TextIO | None = None) -> Any:
    """ondevice.models.materialize.resolve_model, with a bar on a terminal while the model is assembled from its
    chunks (the default model's first use; a model already on disk shows nothing). Off a terminal, nothing."""
    from ondevice.models.materialize import resolve_model

    stream = stream if stream is not None else sys.stderr
    bar = ProgressBar("assembling the model (once)", stream=stream, terminal=True) if stream.isatty() else None
    try:
        return resolve_model(ref, progress=bar)
    finally:
        if bar is not None:
            bar.close()


_COUNTED = re.compile(r"^(?P<what>.*?):? *round (?P<n>\d+) of (?P<total>\d+)")


class StatusLine(_Display):
    """A library's progress lines (the probe's: "host f32 compute", "timing MODEL: round 2 of 3") on a terminal:
    one line rewritten in place, the latest step in it, and a bar with the time left while the steps count
    rounds ("round r of n": r - 1 of n done). Off a terminal every line is printed as it comes, as a log wants.
    close() clears the line."""

    def __init__(self, label: str, **display: Any):
        super().__init__(label, **display)
        self._bar: ProgressBar | None = None
        self._counting = ""  # the step whose rounds the bar counts
        self._shown = False

    def __call__(self, line: str) -> None:
        if not self.terminal:
            self.stream.write(f"{self.label}: {line}\n")
            self.stream.flush()
            return
        counted = _COUNTED.match(line)
        if counted is None:
            self._bar, self._counting = None, ""
            width = shutil.get_terminal_size((80, 24)).columns - 1
            self.stream.write("\r\033[K" + f"{self.label}: {line}"[:width])
            self.stream.flush()
        else:
            what = counted["what"].strip()
            if self._bar is None or what != self._counting:  # new rounds: the time left starts afresh
                self._bar = ProgressBar(f"{self.label}: {what}", stream=self.stream, clock=self.clock, terminal=True)
                self._counting = what
            self._bar(int(counted["n"]) - 1, int(counted["total"]))
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False
