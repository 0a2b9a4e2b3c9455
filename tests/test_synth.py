"""The synthetic builder's models load, tokenize any text and generate through llama-cpp-python."""

from __future__ import annotations

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model, synthetic_vocab


@pytest.fixture(scope="module")
def llm(tiny_model):
    from ondevice.engine import load

    with load(tiny_model, n_ctx=256, n_threads=1, seed=0) as eng:
        yield eng


@pytest.mark.parametrize("text", ["hello world", "Ünïcödé ✓ 日本語 🚀", "the tower\nis in paris!", "\x00\x7f\xff"])
def test_any_text_round_trips_through_the_tokenizer(llm, text):
    ids = llm.tokenize(text, add_bos=False)
    assert ids and all(0 <= i < 512 for i in ids)
    assert llm.detokenize(ids) == text


def test_word_pieces_are_used_rather_than_bytes(llm):
    ids = llm.tokenize(" the", add_bos=False)
    assert len(ids) == 1  # "\u2581the" is one token


def test_generates_deterministically(llm):
    a = llm.generate("hello", max_tokens=8, temperature=0.0)
    b = llm.generate("hello", max_tokens=8, temperature=0.0)
    assert a.text == b.text
    assert a.timings.output_tokens >= 1


def test_vocab_has_specials_bytes_and_the_requested_size():
    tokens, scores, types = synthetic_vocab(300)
    assert len(tokens) == len(scores) == len(types) == 300
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3 + 0x41] == "<0x41>"


def test_invalid_configs_are_refused(tmp_path):
    for cfg in (SynthConfig(d_model=65), SynthConfig(n_vocab=100), SynthConfig(dtype="Q4_0")):
        with pytest.raises(ValueError):
            build_synthetic_model(cfg, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
