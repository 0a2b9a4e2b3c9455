"""KV state on disk: a round trip continues identically; another model, context or prompt, and damaged or
special files, are refused with StateFileError and leave the engine recomputing."""

from __future__ import annotations

import os

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.core.errors import StateFileError
from ondevice.engine import load

PROMPT = "the people of the world are in the city of paris and"
MORE = " the river runs to the sea"


def greedy(engine, prompt, **kw):
    kw.setdefault("max_tokens", 12)
    return engine.generate(prompt, temperature=0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def other_model(synth_dir):
    return build_synthetic_model(SynthConfig(seed=9), synth_dir / "state-other.gguf")


@pytest.fixture
def saved(tiny_model, tmp_path):
    """A state file of PROMPT's prefill and first output on the tiny model, and what came next in memory."""
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        first = greedy(eng, PROMPT)
        path = tmp_path / "s.kv"
        n_bytes = eng.save_state(path)
        held = eng.kv_cache_tokens
        follow = greedy(eng, eng.tokenize(PROMPT) + list(first.token_ids) + eng.tokenize(MORE, add_bos=False))
        repeat = greedy(eng, PROMPT)
    assert n_bytes == path.stat().st_size and held > 0
    return path, first, follow, repeat, held


def test_round_trip_continues_identically(tiny_model, saved):
    path, first, follow, repeat, held = saved
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        assert eng.load_state(path) == held == eng.kv_cache_tokens
        ids = eng.tokenize(PROMPT) + list(first.token_ids) + eng.tokenize(MORE, add_bos=False)
        g = greedy(eng, ids)
        assert g.cached_prompt_tokens == held and g.token_ids == follow.token_ids
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        eng.load_state(path, prompt=eng.tokenize(PROMPT) + list(first.token_ids))
        again = greedy(eng, PROMPT)  # the prompt and its kept logits come back: nothing recomputed
        assert again.token_ids == repeat.token_ids == first.token_ids
        assert again.cached_prompt_tokens == len(eng.tokenize(PROMPT))


def test_state_of_another_model_or_context_is_refused(tiny_model, other_model, saved):
    path = saved[0]
    with load(other_model, n_ctx=256, n_threads=1) as eng:
        with pytest.raises(StateFileError, match="another model file"):
            eng.load_state(path)
        assert eng.kv_cache_tokens == 0
    with load(tiny_model, n_ctx=512, n_threads=1) as eng:
        with pytest.raises(StateFileError, match="another n_ctx"):
            eng.load_state(path)


def test_state_of_another_prompt_is_refused(tiny_model, saved):
    path = saved[0]
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        with pytest.raises(StateFileError, match="another prompt"):
            eng.load_state(path, prompt=eng.tokenize("something else entirely, nothing in common"))
        assert eng.kv_cache_tokens == 0
        g = greedy(eng, PROMPT)  # recomputed from nothing
        assert g.cached_prompt_tokens == 0 and g.token_ids == saved[1].token_ids


@pytest.mark.parametrize("damage", ["truncated", "garbage", "flipped", "empty"])
def test_damaged_state_is_refused(tiny_model, saved, tmp_path, damage):
    raw = saved[0].read_bytes()
    bad = tmp_path / "bad.kv"
    if damage == "truncated":
        bad.write_bytes(raw[: len(raw) - 100])
    elif damage == "garbage":
        bad.write_bytes(os.urandom(len(raw)))
    elif damage == "flipped":
        bad.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))
    else:
        bad.write_bytes(b"")
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        with pytest.raises(StateFileError):
            eng.load_state(bad)
        assert eng.kv_cache_tokens == 0


def test_special_files_are_refused(tiny_model, tmp_path):
    link = tmp_path / "zero.kv"
    link.symlink_to("/dev/zero")
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        for path in (tmp_path, link, tmp_path / "missing.kv"):
            with pytest.raises(StateFileError):
                eng.load_state(path)


@pytest.mark.parametrize(
    ("state_bytes", "disk_gbs", "recompute_s", "restore", "restore_s"),
    [
        (100_000_000, 1.0, 0.5, True, 0.1),  # 0.1 s read beats 0.5 s prefill
        (100_000_000, 0.1, 0.5, False, 1.0),  # a slow disk: 1 s read loses to 0.5 s prefill
        (100_000_000, None, 0.5, True, None),  # no disk figure: restoring is never a wrong answer
        (100_000_000, 1.0, None, True, 0.1),
    ],
)
def test_restore_or_recompute_is_the_predicted_faster(state_bytes, disk_gbs, recompute_s, restore, restore_s):
    from ondevice.engine.state import choose_resume

    choice = choose_resume(state_bytes, disk_gbs, recompute_s)
    assert choice.restore is restore and choice.recompute_s == recompute_s
    assert choice.restore_s == (pytest.approx(restore_s) if restore_s is not None else None)
    text = choice.text()
    assert ("restoring" if restore else "recomputing") in text and "restore predicted" in text and "recompute" in text
