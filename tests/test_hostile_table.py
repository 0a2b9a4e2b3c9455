"""benchmarks/hostile_table.py's judging of one case's run, and its table (the cases themselves run as a script)."""

from __future__ import annotations

import signal

import pytest

from benchmarks.hostile_table import Case, Run, judge, table


def case(**kw) -> Case:
    return Case(0, "c", ["-c", "pass"], **kw)


@pytest.mark.parametrize(
    "run, kind",
    [
        (Run(0, "", ""), "clean"),
        (Run(2, "", "ondevice: error: bad input\n"), "clean"),
        (Run(2, "", "usage: ondevice run ...\nondevice run: error: argument --seed: invalid int value\n"), "clean"),
        (Run(2, "", "ondevice: history h: a note\nondevice: error: bad\n"), "clean"),
        (Run(None, "", ""), "hang"),
        (Run(-6, "", ""), "signal"),
        (Run(1, "", "Traceback (most recent call last):\n  ...\nValueError: x\n"), "traceback"),
        (Run(0, "", "Traceback (most recent call last):\nValueError\n"), "traceback"),
        (Run(1, "", "ondevice: error: x\n"), "lost"),  # exit 1 where the case allows only 0 and 2
        (Run(2, "", "ondevice: error: one\nondevice: error: two\n"), "lost"),
        (Run(2, "", "something went wrong\n"), "lost"),
    ],
)
def test_judge(run, kind):
    assert judge(case(), run)[0] == kind


def test_a_signal_the_case_sent_is_judged_by_its_check():
    kill = case(ok=(0, -9), send=(0.1, signal.SIGKILL), check=lambda run: None)
    assert judge(kill, Run(-9, "", "", signalled=True))[0] == "clean"
    assert judge(kill, Run(-11, "", "", signalled=True))[0] == "signal"
    assert judge(kill, Run(-9, "", "", signalled=False))[0] == "signal"


def test_a_check_finding_is_lost():
    found = case(check=lambda run: "notes.md was changed")
    assert judge(found, Run(2, "", "ondevice: error: refused\n")) == ("lost", "notes.md was changed")


def test_table_counts_by_group_and_kind():
    results = [(Case(0, "a", []), "clean", ""), (Case(0, "b", []), "signal", "x"), (Case(3, "c", []), "hang", "y")]
    text = table(results)
    assert "| damaged GGUF files and special paths | 2 | 1 | 0 | 1 | 0 | 0 |" in text
    assert "| interruption (SIGINT/TERM/KILL mid-work) | 1 | 0 | 0 | 0 | 1 | 0 |" in text
    assert text.splitlines()[-1] == "| all | 3 | 1 | 0 | 1 | 1 | 0 |"
    assert "concurrency" not in text  # a group not run is not shown
