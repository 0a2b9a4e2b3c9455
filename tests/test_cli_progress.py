"""ondevice/cli/progress.py: the bar's text, its estimate of the time left, and plain lines off a terminal."""

from __future__ import annotations

import io

from ondevice.cli.progress import ProgressBar, eta_text


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
