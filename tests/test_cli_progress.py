"""ondevice/cli/progress.py: the bar's text, its estimate of the time left, and plain lines off a terminal;
the step display the bench and the probe use."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest

from ondevice.cli.progress import STEP_TEXT, ProgressBar, StatusLine, StepProgress, eta_text, step_progress


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_text_shows_fraction_and_time_left_from_the_clock():
    clock = Clock()
    bar = ProgressBar("probe", stream=io.StringIO(), clock=clock, terminal=True)
    assert bar.text(0, 8) == "probe [--------------------] 0/8   0% ETA --"
    clock.now_s += 30  # a quarter in 30 s: 90 s left
    assert bar.text(2, 8) == "probe [#####---------------] 2/8  25% ETA 1:30"
    clock.now_s += 3570
    assert bar.text(4, 8).endswith("4/8  50% ETA 1:00:00")


def test_eta_text():
    assert eta_text(None) == "ETA --" and eta_text(5.4) == "ETA 0:05" and eta_text(3725) == "ETA 1:02:05"


def test_terminal_overwrites_one_line_and_clears_it():
    out = io.StringIO()
    bar = ProgressBar("quantize", stream=out, clock=Clock(), terminal=True)
    bar(1, 2)
    bar(2, 2)
    bar.close()
    assert out.getvalue().count("\r\033[K") == 3 and "\n" not in out.getvalue()


def test_not_a_terminal_gives_plain_lines_one_per_tenth():
    out = io.StringIO()
    bar = ProgressBar("ladder", stream=out, clock=Clock(), terminal=False)
    for done in range(101):
        bar(done, 100)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and all("\r" not in line and "\033" not in line for line in lines)
    assert lines[0].startswith("ladder [") and " 0/100 " in lines[0] and lines[-1].split()[2] == "100/100"


def step(done: int, total: int, description: str) -> SimpleNamespace:
    return SimpleNamespace(done=done, total=total, description=description)


def test_steps_on_a_terminal_are_one_bar_naming_the_step_with_the_time_left():
    out, clock = io.StringIO(), Clock()
    display = StepProgress("bench", stream=out, clock=clock, terminal=True)
    display(step(0, 4, "model.gguf resident"))
    clock.now_s += 10
    display(step(1, 4, "x" * 100))  # a long description is cut so the bar stays on one line
    display.close()
    frames = [f for f in out.getvalue().split("\r\033[K") if f]
    assert frames[0].startswith("bench: model.gguf resident [") and frames[0].endswith("0/4   0% ETA --")
    assert frames[1].startswith("bench: " + "x" * (STEP_TEXT - 3) + "... [") and frames[1].endswith("ETA 0:30")
    assert out.getvalue().endswith("\r\033[K") and "\n" not in out.getvalue()


def test_steps_off_a_terminal_are_plain_lines_one_per_step():
    out = io.StringIO()
    display = StepProgress("bench", stream=out, terminal=False)
    display(step(0, 2, "a resident"))
    display(step(2, 2, "done"))
    display.close()
    assert out.getvalue() == "[0/2] a resident\n[2/2] done\n"


def test_step_progress_is_none_when_disabled_and_clears_its_bar_after_an_error(monkeypatch):
    with step_progress("bench", enabled=False) as display:
        assert display is None
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", out)
    with pytest.raises(KeyboardInterrupt), step_progress("bench") as display:
        display(step(1, 3, "resident"))
        raise KeyboardInterrupt
    assert out.getvalue().endswith("\r\033[K")


def test_status_line_on_a_terminal_rewrites_one_line_and_counts_rounds_with_a_bar():
    out, clock = io.StringIO(), Clock()
    status = StatusLine("probing", stream=out, clock=clock, terminal=True)
    status("host f32 compute")
    status("timing tiny.gguf: round 1 of 4")
    clock.now_s += 20
    status("timing tiny.gguf: round 2 of 4")  # one of four done in 20 s: 60 s left
    status("timing the twins: round 1 of 2")  # other rounds: a new bar, its time left unknown yet
    status.close()
    frames = [f for f in out.getvalue().split("\r\033[K") if f]
    assert frames[0] == "probing: host f32 compute"
    assert frames[1].startswith("probing: timing tiny.gguf [") and frames[1].endswith("0/4   0% ETA --")
    assert frames[2].endswith("1/4  25% ETA 1:00")
    assert frames[3].startswith("probing: timing the twins [") and frames[3].endswith("0/2   0% ETA --")
    assert "\n" not in out.getvalue() and out.getvalue().endswith("\r\033[K")


def test_status_line_off_a_terminal_prints_every_line():
    out = io.StringIO()
    status = StatusLine("probing", stream=out, terminal=False)
    status("host f32 compute")
    status("timing tiny.gguf: round 1 of 4")
    status.close()
    assert out.getvalue() == "probing: host f32 compute\nprobing: timing tiny.gguf: round 1 of 4\n"
