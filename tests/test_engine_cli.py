"""`ondevice run` / `ondevice generate`: streamed text on stdout, one timings line, exit 2 on bad input."""

from __future__ import annotations

import pytest

from ondevice.cli.main import main
from tests._engine_models import EOS, build_successor_model, token_id

SP = "\u2581"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    chain = [token_id(SP + "of"), token_id(SP + "hello"), token_id(SP + "world"), token_id("!"), EOS]
    return build_successor_model(tmp_path_factory.mktemp("cli") / "succ.gguf", [chain])


@pytest.mark.parametrize("command", ["run", "generate"])
def test_run_streams_text_then_timings(model, capsys, command, offload_backend):
    rc = main([command, str(model), " of", "-t", "0", "-n", "8", "-c", "256", "--threads", "1", "--no-predict"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == " hello world!\n"
    lines = err.strip().splitlines()
    assert len(lines) == 1
    line = lines[0]
    for field in (
        "TTFT",
        "TPOT",
        "decode",
        "tok/s",
        "prefill",
        "tokens 2 prompt + 4 output",
        "finish stop",
        f"on {offload_backend}",
    ):
        assert field in line


def test_run_stop_string_and_max_tokens(model, capsys):
    assert main(["run", str(model), " of", "-t", "0", "-n", "2", "--stop", "xyz", "-c", "256", "--no-predict"]) == 0
    out, err = capsys.readouterr()
    assert out == " hello world\n" and "finish length" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "MODEL", "x", "-n", "-1"], "max_tokens"),
        (["run", "MODEL", "x", "--top-p", "0"], "top_p"),
        (["run", "MODEL", "x", "-t", "-1"], "temperature"),
        (["run", "MODEL", "x", "--n-gpu-layers", "many"], "n-gpu-layers"),
        (["run", "MODEL", "x", "y"], "[MODEL] PROMPT"),
        (["run", "/no/such/model.gguf", "x"], "no such file"),
        (["run", "MODEL", "x", "-c", "0", "-n", "100000"], "context window"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(model, capsys, argv, needle):
    argv = [str(model) if a == "MODEL" else a for a in argv]
    rc = main(argv + ["--threads", "1", "--no-predict"])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ondevice: error:") and needle in lines[0]
    assert "Traceback" not in err and out == ""


class _InterruptedAfter:
    """An Engine.stream whose consumer gets Ctrl-C after `n` events (as a SIGINT mid-generation would)."""

    def __init__(self, stream, n: int):
        self._stream, self._n = stream, n

    def __iter__(self):
        for i, ev in enumerate(self._stream):
            if i == self._n:
                raise KeyboardInterrupt
            yield ev

    def close(self):
        self._stream.close()

    @property
    def generation(self):
        return self._stream.generation


@pytest.mark.parametrize("after_events", [0, 3])
def test_run_interrupted_mid_generation_says_so_and_exits_130(tiny_model, monkeypatch, capsys, after_events):
    from ondevice.engine.engine import Engine

    original = Engine.stream
    monkeypatch.setattr(
        Engine, "stream", lambda self, *a, **kw: _InterruptedAfter(original(self, *a, **kw), after_events)
    )
    code = main(["run", str(tiny_model), " of", "-t", "0", "-n", "16", "--ignore-eos", "-c", "256", "--no-predict"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "interrupted" in err


def test_sigterm_takes_ctrl_c_s_path_and_exits_143(tiny_model, monkeypatch, capsys):
    import os
    import signal

    import ondevice.cli.run as run_cmd

    def terminated_while_reading() -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler main installed raises at the next bytecode
        return "never reached"

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(run_cmd, "_read_stdin", terminated_while_reading)
    assert main(["run", str(tiny_model), "-", "-c", "256", "--no-predict"]) == 143
    assert "terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # the process's own handler is back
