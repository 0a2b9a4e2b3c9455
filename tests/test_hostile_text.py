"""Text that is not valid UTF-8 (issue 13): lone surrogates and invalid bytes become U+FFFD, never a traceback."""

from __future__ import annotations

import io
import random
import subprocess
import sys

import pytest

from ondevice.cli.main import main
from ondevice.core.textclean import clean_text

ESCAPED = b"\xff\xfe hello".decode("utf-8", "surrogateescape")  # how Python hands such bytes over from argv
LONE = "\ud800 hello \udfff"  # halves of UTF-16 pairs, as a careless caller may pass them
RUN = ["-t", "0", "-n", "2", "-c", "256", "--threads", "1", "--no-predict"]


@pytest.mark.parametrize(
    "text, clean",
    [
        ("plain ünïcode 😀", "plain ünïcode 😀"),
        (ESCAPED, "\ufffd\ufffd hello"),
        (LONE, "\ufffd hello \ufffd"),
        (b"caf\xc3\xa9 \xe4\xb8".decode("utf-8", "surrogateescape"), "café \ufffd"),  # a truncated character
        ("\ud83d\ude00", "😀"),  # a UTF-16 pair left unjoined
    ],
)
def test_clean_text(text, clean):
    assert clean_text(text) == clean
    clean_text(text).encode("utf-8")


@pytest.mark.parametrize("text", [ESCAPED, LONE])
def test_tokenize_and_generate_replace_lone_surrogates(engine, text):
    assert engine.tokenize(text) == engine.tokenize(clean_text(text))
    g = engine.generate(text, max_tokens=2, temperature=0, ignore_eos=True)
    assert g.timings.output_tokens == 2 and g.prompt_tokens == len(engine.tokenize(text))


def test_argv_prompt_with_invalid_utf8(tiny_model, capsys):
    assert main(["run", str(tiny_model), ESCAPED, *RUN]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "finish length" in err


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])  # a UTF-8 locale; the C locale
def test_stdin_prompt_with_invalid_utf8(tiny_model, engine, capsys, monkeypatch, errors):
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe hello \xc3"), encoding="utf-8", errors=errors)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["run", str(tiny_model), "-", *RUN]) == 0
    n_prompt = len(engine.tokenize("\ufffd\ufffd hello \ufffd"))
    err = capsys.readouterr().err
    assert "finish length" in err and f"tokens {n_prompt} prompt" in err


def test_random_bytes_on_stdin_in_a_real_process(tiny_model):
    proc = subprocess.run(
        [sys.executable, "-m", "ondevice.cli.main", "run", str(tiny_model), "-", *RUN],
        input=random.Random(0).randbytes(60),
        capture_output=True,
        timeout=120,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "finish length" in err
