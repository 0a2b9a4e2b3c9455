"""`ondevice run --prompt-cache FILE`: computed and saved, then restored; a cache of another context is
recomputed and replaced; a directory, device or foreign file is refused with one line and exit 2."""

from __future__ import annotations

import pytest

from ondevice.cli.main import main

PROMPT = "the people of the world are in the city of paris and"


def run(model, cache, capsys, n_ctx="256"):
    argv = ["run", str(model), PROMPT, "-t", "0", "-n", "6", "-c", n_ctx, "--threads", "1", "--no-predict"]
    rc = main([*argv, "--prompt-cache", str(cache)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_prompt_cache_is_saved_then_restored(tiny_model, tmp_path, capsys):
    cache = tmp_path / "p.kv"
    rc, text1, err1 = run(tiny_model, cache, capsys)
    assert rc == 0 and "none yet" in err1 and "saved" in err1 and cache.is_file()
    rc, text2, err2 = run(tiny_model, cache, capsys)
    assert rc == 0 and "restored" in err2 and text2 == text1  # the same answer from the restored cache
    rc, text3, err3 = run(tiny_model, cache, capsys, n_ctx="512")
    assert rc == 0 and "another n_ctx" in err3 and "computing the prompt" in err3 and text3 == text1


@pytest.mark.parametrize("kind", ["directory", "device", "foreign"])
def test_bad_prompt_cache_path_is_one_line_and_exit_2(tiny_model, tmp_path, capsys, kind):
    if kind == "directory":
        path = tmp_path
    elif kind == "device":
        path = tmp_path / "zero.kv"
        path.symlink_to("/dev/zero")
    else:
        path = tmp_path / "notes.txt"
        path.write_text("my notes\n")
    rc, _, err = run(tiny_model, path, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "prompt-cache" in err
    if kind == "foreign":
        assert path.read_text() == "my notes\n"  # nothing lost
