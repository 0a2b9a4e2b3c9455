"""Every engine error is typed, named, and refused before any work."""

from __future__ import annotations

import pytest

from ondevice.core.errors import (
    ContextOverflowError,
    EngineError,
    GGUFFormatError,
    InvalidParameterError,
    ModelNotFoundError,
)
from ondevice.engine import load
from ondevice.engine.sampling import make_params


def test_context_overflow_refused_before_any_work(engine):
    first = engine.generate("the city", max_tokens=3, temperature=0)
    kv = engine.kv_cache_tokens
    prompt = engine.tokenize("the " * 30)
    n = len(prompt)
    with pytest.raises(ContextOverflowError) as info:
        engine.stream(prompt, max_tokens=256 - n + 1)
    msg = str(info.value)
    assert f"prompt of {n} tokens + max_tokens {256 - n + 1} = 257 tokens" in msg and "256" in msg
    assert engine.kv_cache_tokens == kv and not engine.busy  # nothing ran, the cache is as it was
    g = engine.generate(prompt, max_tokens=256 - n, temperature=0, ignore_eos=True)  # exactly fits
    assert g.finish_reason == "length" and engine.kv_cache_tokens == 255
    assert g.prompt_tokens == n
    assert first.finish_reason in ("stop", "length")


def test_context_overflow_text_prompt(engine):
    with pytest.raises(ContextOverflowError, match="exceeds the context window of 256 tokens"):
        engine.generate("the city " * 200, max_tokens=1)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": [3]}, "stop"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"reuse_prefix": 1}, "reuse_prefix"),
        ({"cancel": object()}, "cancel"),
    ],
)
def test_invalid_parameters_refused_by_name(engine, kw, name):
    with pytest.raises(InvalidParameterError, match=name):
        engine.stream("the city", **kw)
    assert not engine.busy


def test_valid_edges_accepted():
    p = make_params(top_p=1.0, min_p=0.0, temperature=0, top_k=0, max_tokens=0, seed=0, stop="x")
    assert p.greedy and p.stop == ("x",)


@pytest.mark.parametrize("prompt", [[], [-1], [10**6], ["a"], [1.5]])
def test_bad_token_prompts(engine, prompt):
    with pytest.raises(InvalidParameterError):
        engine.generate(prompt, max_tokens=1)


def test_non_string_text(engine):
    with pytest.raises(InvalidParameterError):
        engine.tokenize(b"bytes")


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"n_ctx": -1}, "n_ctx"),
        ({"n_batch": 0}, "n_batch"),
        ({"n_threads": 0}, "n_threads"),
        ({"n_gpu_layers": "all"}, "n_gpu_layers"),
        ({"n_gpu_layers": -2}, "n_gpu_layers"),
        ({"flash_attn": "yes"}, "flash_attn"),
        ({"seed": -3}, "seed"),
        ({"predictor": "best"}, "predictor"),
        ({"predictor": object()}, "predictor"),
    ],
)
def test_invalid_load_parameters(tiny_model, kw, name):
    kw.setdefault("predictor", None)
    with pytest.raises(InvalidParameterError, match=name):
        load(tiny_model, **kw)


def test_malformed_file_never_reaches_llama_cpp(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(GGUFFormatError):
        load(bad)
    with pytest.raises(GGUFFormatError):
        (tmp_path / "empty.gguf").write_bytes(b"")
        load(tmp_path / "empty.gguf")


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load(tmp_path / "nope.gguf")


def test_closed_engine(tiny_model):
    eng = load(tiny_model, n_ctx=256, n_threads=1)
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(EngineError, match="closed"):
        eng.generate("x", max_tokens=1)


def test_chat_overflow_refused(engine):
    chat = engine.chat(max_tokens=250)
    with pytest.raises(ContextOverflowError):
        chat.send("the city of paris is in france")
    assert chat.messages == []  # the refused turn left no trace
    with pytest.raises(InvalidParameterError, match="temprature"):
        engine.chat(temprature=0.1)
    with pytest.raises(InvalidParameterError, match="top_p"):
        engine.chat(top_p=2)


@pytest.mark.parametrize(
    "n_ctx, message",
    [
        (1, "below llama.cpp's smallest context of 256 tokens"),
        (64, "below llama.cpp's smallest context of 256 tokens"),
        (255, "below llama.cpp's smallest context of 256 tokens"),
        (513, "beyond the model's trained context of 512 tokens"),
        (40000, "beyond the model's trained context of 512 tokens"),
        (-1, "n_ctx must be a non-negative integer"),
    ],
)
def test_n_ctx_outside_what_llama_cpp_and_the_model_take_is_refused(tiny_model, n_ctx, message):
    with pytest.raises(InvalidParameterError, match=message):
        load(tiny_model, n_ctx=n_ctx, n_threads=1, predictor=None)


@pytest.mark.parametrize("n_ctx, used", [(None, 512), (0, 512), (256, 256), (512, 512), (300, 512)])
def test_n_ctx_default_trained_and_rounded(tiny_model, n_ctx, used):
    """None: 4096 capped at the trained context (512 here); 0: the trained context; llama.cpp rounds up to 256s."""
    with load(tiny_model, n_ctx=n_ctx, n_threads=1, predictor=None) as eng:
        assert eng.n_ctx == used
