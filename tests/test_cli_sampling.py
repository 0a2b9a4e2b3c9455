"""`run`, `chat` and `bench` take the same sampler flags (ondevice.cli.sampling_args), with the engine's
defaults, and check them by the API's rules: a bad value is one line naming the flag, exit 2, before
any model is loaded."""

from __future__ import annotations

import argparse
import types

import pytest

from ondevice.cli import chat as chat_cli
from ondevice.cli.bench import _config
from ondevice.cli.main import build_parser, main
from ondevice.cli.sampling_args import SAMPLER_FLAGS
from ondevice.engine.sampling import DEFAULTS

COMMANDS = {"run": ["run", "a prompt"], "chat": ["chat"], "bench": ["bench"]}
GOOD = ["--temperature", "0.5", "--top-k", "7", "--top-p", "0.5", "--min-p", "0.2", "--repeat-penalty", "1.1"]
GOOD_VALUES = {"temperature": 0.5, "top_k": 7, "top_p": 0.5, "min_p": 0.2, "repeat_penalty": 1.1}


def _sampler_options(parser, command: str) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices[command]._actions for o in a.option_strings if o in SAMPLER_FLAGS}


def test_every_sampling_command_declares_every_sampler_flag():
    parser = build_parser()
    for command in COMMANDS:
        assert _sampler_options(parser, command) == set(SAMPLER_FLAGS), command


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_reads_the_flags_to_the_same_names(command):
    parser = build_parser()
    defaults = parser.parse_args(COMMANDS[command])
    assert {name: getattr(defaults, name) for name in GOOD_VALUES} == DEFAULTS.sampler_settings()
    given = parser.parse_args(COMMANDS[command] + GOOD)
    assert {name: getattr(given, name) for name in GOOD_VALUES} == GOOD_VALUES


def test_the_bench_samples_with_every_flag():
    args = build_parser().parse_args(["bench", *GOOD])
    assert _config(args).sampling == GOOD_VALUES


BAD = [
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-k", "-3"], "--top-k"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--min-p", "2"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-penalty", "inf"], "--repeat-penalty"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bad, flag", BAD, ids=[" ".join(b) for b, _ in BAD])
def test_each_command_refuses_a_bad_value_in_one_line(command, bad, flag, tmp_path, capsys):
    argv = COMMANDS[command] + bad + ["--no-predict" if command == "run" else "--force"]
    if command == "chat":
        argv = ["chat", *bad, "--history-db", str(tmp_path / "h.sqlite3")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ondevice: error: {flag}:"), err
    assert out == ""


def test_a_flag_that_is_not_a_number_is_argparse_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--top-k", "many"])
    assert exc.value.code == 2 and "--top-k" in capsys.readouterr().err


def test_chat_passes_the_flags_its_settings_screen_lacks_to_every_turn(tiny_model, monkeypatch):
    seen = {}

    def run_app(path, settings, store, resume, load_kwargs, sampling):
        seen.update(settings=settings, sampling=sampling)
        return 0

    tty = types.SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr(chat_cli, "sys", types.SimpleNamespace(stdin=tty, stdout=tty, stderr=None))
    monkeypatch.setattr(chat_cli, "_run_app", run_app)
    assert main(["chat", str(tiny_model), "--no-history", *GOOD]) == 0
    assert (seen["settings"].temperature, seen["settings"].top_p) == (0.5, 0.5)
    assert seen["sampling"] == {"top_k": 7, "min_p": 0.2, "repeat_penalty": 1.1}
