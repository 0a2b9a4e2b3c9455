"""Hostile command lines (issue 13): one clear line and exit 2 for bad input, llama.cpp's log kept off the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ondevice.cli.main import main

QUIET = ["--threads", "1", "--no-predict"]


@pytest.fixture(scope="module")
def unknown_arch(tiny_model, tmp_path_factory):
    """Passes our checks (a consistent GGUF) but llama.cpp refuses it: architecture 'llamb' is unknown."""
    path = tmp_path_factory.mktemp("arch") / "llamb.gguf"
    path.write_bytes(tiny_model.read_bytes().replace(b"llama", b"llamb"))
    return path


def _ondevice(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ondevice.cli.main", *argv], capture_output=True, text=True, timeout=120
    )


def test_llama_cpp_error_lines_go_to_the_log_only(unknown_arch):
    proc = _ondevice("run", str(unknown_arch), "hi", *QUIET)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ondevice: error:") and "could not load" in lines[0], proc.stderr
    shown = _ondevice("--log-level", "info", "run", str(unknown_arch), "hi", *QUIET)
    assert shown.returncode == 2
    assert "unknown model architecture: 'llamb'" in shown.stderr  # asked for: llama.cpp's lines are there
    assert shown.stderr.strip().splitlines()[-1] == lines[0]


def test_unknown_log_level_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--log-level", "BOGUS", "models", "--where"])
    assert exit_.value.code == 2
    assert "--log-level" in capsys.readouterr().err


@pytest.mark.parametrize("level", ["debug", "Info", "WARNING", "error", "critical"])
def test_log_level_is_case_insensitive(level, capsys):
    assert main(["--log-level", level, "models", "--where"]) == 0
    assert "user registry" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "MODEL", "-n", "2", "the city"],  # options between MODEL and PROMPT
        ["run", "-n", "2", "MODEL", "the city"],
        ["run", "MODEL", "the city", "-n", "2"],
        ["generate", "MODEL", "-t", "0", "the city", "-n", "2"],
        ["run", "MODEL", "-n", "2", "-"],  # '-' = stdin, after an option
    ],
)
def test_options_may_go_anywhere_among_model_and_prompt(tiny_model, argv, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the city")))
    argv = [str(tiny_model) if a == "MODEL" else a for a in argv]
    assert main([*argv, "--ignore-eos", "-c", "256", *QUIET]) == 0
    err = capsys.readouterr().err
    assert "+ 2 output" in err, err


def test_unknown_option_among_positionals_is_still_refused(tiny_model, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(tiny_model), "--bogus", "the city", *QUIET])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_three_positionals_are_one_line_and_exit_2(tiny_model, capsys):
    assert main(["run", str(tiny_model), "a", "-n", "2", "b", *QUIET]) == 2
    assert "[MODEL] PROMPT" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "MODEL", "x", "-c", "1", *QUIET], "n_ctx 1 is below llama.cpp's smallest context of 256"),
        (["run", "MODEL", "x", "-c", "64", *QUIET], "n_ctx 64 is below llama.cpp's smallest context of 256"),
        (["chat", "MODEL", "-c", "64"], "n_ctx 64 is below llama.cpp's smallest context of 256"),
        (["bench", "MODEL", "--n-ctx", "64", "--no-progress"], "n_ctx 64 is below llama.cpp's smallest context of 256"),
        (["run", "MODEL", "x", "-c", "40000", *QUIET], "n_ctx 40000 is beyond the model's trained context of 512"),
        (["chat", "MODEL", "-c", "40000"], "n_ctx 40000 is beyond the model's trained context of 512"),
    ],
)
def test_context_size_rule_is_the_same_everywhere(tiny_model, tmp_path, argv, message, capsys):
    argv = [str(tiny_model) if a == "MODEL" else a for a in argv]
    if argv[0] == "chat":
        argv += ["--history-db", str(tmp_path / "h.sqlite3")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ondevice: error:") and message in lines[0], err
    assert out == ""


def test_predict_refuses_past_the_trained_context_before_probing(tiny_model, monkeypatch, capsys):
    import ondevice.probing as probing
    import ondevice.probing.cache as probe_cache

    monkeypatch.setattr(probe_cache, "load_cached", lambda backend: None)  # no probe yet: predict would probe first
    monkeypatch.setattr(probing, "probe", lambda **kw: pytest.fail("probed before refusing the context"))
    assert main(["predict", str(tiny_model), "--ctx", "256,1024"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ondevice: error: context 1024 is beyond the model's trained context of 512 tokens"]


@pytest.mark.parametrize("signum, code, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_a_signal_while_the_commands_are_imported_is_said_not_a_traceback(monkeypatch, capsys, signum, code, word):
    import signal

    from ondevice.cli import main as cli_main

    sig = getattr(signal, signum)

    def build_parser():  # the signal lands while the command modules are imported and the parser built
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.SIG_IGN):
            raise AssertionError(f"{signum} would kill the process here: no handler yet")
        signal.raise_signal(sig)
        raise AssertionError(f"{signum} did not stop the command")

    monkeypatch.setattr(cli_main, "build_parser", build_parser)
    assert cli_main.main(["models"]) == code
    assert capsys.readouterr().err.strip() == f"ondevice: {word}"
