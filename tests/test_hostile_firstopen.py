"""A file that aborts llama.cpp but passes the Python load checks: first opened vocab-only in a child,
so the abort is one line and exit 2, and the verdict is kept by the file's identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from gguf import GGUFValueType as VT

from ondevice.core.errors import ModelLoadError
from ondevice.llama import firstopen
from ondevice.llama.guard import CheckOutcome
from tests.gguf_craft import array, join, kv, split, string
from tests.gguf_fuzz import damaged_vocabulary


def aborting_file(tiny_model, folder):
    """The tiny model with every token's text empty: llama.cpp aborts building its vocabulary (SIGABRT).
    The load checks refuse this one; the tests below let it past them to reach the child."""
    parts = split(tiny_model)
    n_tokens = 512
    tokens = kv("tokenizer.ggml.tokens", VT.ARRAY, array(VT.STRING, [string("")] * n_tokens))
    parts.kvs = [e for e in parts.kvs if b"tokenizer.ggml.tokens" not in e[:40]] + [tokens]
    path = folder / "aborts.gguf"
    path.write_bytes(join(parts))
    return path


def without_byte_tokens(tiny_model, folder):
    """The tiny model with its 256 byte tokens (<0x00>..<0xFF>) renamed: every check in Python passes and
    llama.cpp opens it, then aborts (std::out_of_range in byte_to_token) on the first text that needs a
    byte fallback, "hi" among them."""
    from ondevice.quant.synth import synthetic_vocab

    tokens = [f"<gone-{t[3:5]}>" if t.startswith("<0x") and len(t) == 6 else t for t in synthetic_vocab(512)[0]]
    parts = split(tiny_model)
    entry = kv("tokenizer.ggml.tokens", VT.ARRAY, array(VT.STRING, [string(t) for t in tokens]))
    parts.kvs = [e for e in parts.kvs if b"tokenizer.ggml.tokens" not in e[:40]] + [entry]
    path = folder / "no-byte-tokens.gguf"
    path.write_bytes(join(parts))
    return path


def no_child(path):
    raise AssertionError(f"opened {path} in a child again: the stored verdict was not used")


def test_an_abort_is_one_line_exit_2_and_the_process_lives_on(tiny_model, tmp_path):
    from ondevice.gguf.loadcheck import inspect_for_load

    path = without_byte_tokens(tiny_model, tmp_path)
    inspect_for_load(path)  # the Python checks let it through: only the child stands between llama.cpp and it
    env = {**os.environ, "ONDEVICE_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "ondevice.cli.main", "run", str(path), "hi", "--no-predict", "-n", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "SIGABRT" in lines[0] and str(path) in lines[0] and "Traceback" not in proc.stderr
    stored = list((tmp_path / "cache" / "native" / "first-open").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["crashed"] is True


def test_the_verdict_is_kept_by_file_identity(tiny_model, tmp_path, monkeypatch):
    path = aborting_file(tiny_model, tmp_path)
    root = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="SIGABRT"):
        firstopen.check_first_open(path, root=root)  # a real child, a real abort
    firstopen._memo.clear()  # as a new process would
    with pytest.raises(ModelLoadError, match="SIGABRT"):
        firstopen.check_first_open(path, root=root, opener=no_child)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed: checked again
    opened = []
    firstopen.check_first_open(path, root=root, opener=lambda p: opened.append(p) or CheckOutcome(True, False, "ok"))
    assert opened == [path]


def test_a_split_models_verdict_follows_every_one_of_its_files(tmp_path):
    """llama.cpp opens a split model through its first file and reads the others: a change to any of them, or one
    arriving, is a file not checked yet. A single file's verdict is keyed as before."""
    first, second = tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"
    first.write_bytes(b"GGUF" + bytes(60))
    root = tmp_path / "cache"
    missing = firstopen.verdict_file(first, root)
    second.write_bytes(b"GGUF" + bytes(60))
    present = firstopen.verdict_file(first, root)
    st = second.stat()
    os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = firstopen.verdict_file(first, root)
    assert len({missing, present, changed}) == 3 and None not in {missing, present, changed}
    assert firstopen.verdict_file(second, root) not in {missing, present, changed}  # its own file, checked alone
    assert firstopen.verdict_file(tmp_path / "absent-00001-of-00002.gguf", root) is None  # nothing to open


def test_a_good_file_is_opened_in_a_child_once(tiny_model, tmp_path):
    root = tmp_path / "cache"
    verdict = firstopen.check_first_open(tiny_model, root=root)
    assert verdict is not None and not verdict.crashed and verdict.detail == "ok"
    firstopen._memo.clear()
    assert firstopen.check_first_open(tiny_model, root=root, opener=no_child) == verdict


@pytest.mark.default_model
def test_a_verified_builtin_model_is_not_opened_in_a_child(default_model, tmp_path):
    assert firstopen.check_first_open(default_model, root=tmp_path, opener=no_child) is None


@pytest.mark.parametrize(
    "outcome, stored",
    [
        (CheckOutcome(False, False, "killed from outside (SIGKILL; out of memory?), inconclusive"), False),
        (CheckOutcome(False, False, "failed (exit 3: llama.cpp could not open it vocab-only)"), False),
        (CheckOutcome(False, False, "could not start (No such file)"), False),
        (CheckOutcome(False, False, "timed out after 60 s", hung=True), True),
    ],
)
def test_what_says_nothing_about_the_file_is_not_stored_and_lets_the_load_go_on(tiny_model, tmp_path, outcome, stored):
    root = tmp_path / "cache"
    firstopen.check_first_open(tiny_model, root=root, opener=lambda p: outcome)  # no error: the load goes on
    assert firstopen.verdict_file(tiny_model, root).exists() is stored


@pytest.mark.parametrize("damage", ["garbage", "directory", "other-schema", "crashed-not-bool", "deep"])
def test_a_damaged_verdict_means_checking_again(tiny_model, tmp_path, damage):
    root = tmp_path / "cache"
    store = firstopen.verdict_file(tiny_model, root)
    store.parent.mkdir(parents=True)
    if damage == "directory":
        store.mkdir()
    else:
        text = {
            "garbage": "\x00not json",
            "other-schema": json.dumps({"schema": 99, "crashed": True, "detail": "x"}),
            "crashed-not-bool": json.dumps({"schema": firstopen.SCHEMA, "crashed": "yes", "detail": "x"}),
            "deep": "[" * 10000,
        }[damage]
        store.write_text(text)
    opened = []
    firstopen.check_first_open(
        tiny_model, root=root, opener=lambda p: opened.append(p) or CheckOutcome(True, False, "ok")
    )
    assert opened == [tiny_model]


def test_the_engine_load_goes_through_the_check(tiny_model, tmp_path, monkeypatch):
    from ondevice.engine import load

    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_model.read_bytes())
    crashed = CheckOutcome(False, True, "crashed (SIGABRT)")
    monkeypatch.setattr(firstopen, "open_vocab_only_in_child", lambda p: crashed)
    with pytest.raises(ModelLoadError, match="aborts while opening"):
        load(copy, n_ctx=256, n_threads=1)


@pytest.mark.hostile_slow
def test_damaged_vocabularies_never_kill_the_loading_process(tiny_model, tmp_path):
    """120 damaged vocabularies loaded one after another in one process: each loads, or is refused with a
    typed error (by the load checks or the first-open child); the process itself never dies."""
    files = [damaged_vocabulary(tiny_model, tmp_path, seed) for seed in range(120)]
    script = textwrap.dedent("""
        import sys
        from ondevice.core.errors import OndeviceError
        from ondevice.engine import load
        for path in sys.argv[1:]:
            try:
                load(path, n_ctx=256, n_threads=1, predictor=None).close()
                print("loaded", flush=True)
            except OndeviceError as exc:
                print("refused", type(exc).__name__, flush=True)
    """)
    env = {**os.environ, "ONDEVICE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcomes = proc.stdout.split("\n")
    assert len([o for o in outcomes if o]) == len(files)
