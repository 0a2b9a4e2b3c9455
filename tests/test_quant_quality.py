"""Perplexity, KL divergence and top-1 agreement through llama.cpp logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from ondevice.quant import quality
from ondevice.quant.quantize import quantize
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.cli.main import main
from ondevice.core.errors import InvalidParameterError, QuantError
from ondevice.llama.logits import LogitsModel

TOKENS = 1600  # of the shipped text: three full windows of 512 (BOS + 511), the short rest dropped


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("quality")
    return {"F16": tiny_model, **{t: quantize(tiny_model, d / f"{t}.gguf", t) for t in ("Q8_0", "Q4_0")}}


def test_shipped_text_is_a_few_thousand_tokens():
    text = quality.default_text()
    assert "Down the Rabbit-Hole" in text and "truth universally acknowledged" in text
    assert 2500 < len(text.split()) < 5000


def test_windows_score_the_second_half():
    windows = quality._windows(list(range(100, 130)), 8, bos=1)
    assert windows[0] == ([1, 100, 101, 102, 103, 104, 105, 106], 4)
    assert all(w[0] == 1 and len(w) <= 8 for w, _ in windows)
    # 30 tokens in bodies of 7: four full windows scoring 4 each; the last 2 tokens do not reach half a window
    assert len(windows) == 4 and sum(len(w) - first for w, first in windows) == 16
    # a last window past the half is scored from the half on
    windows = quality._windows(list(range(100, 126)), 8, bos=1)
    assert windows[-1] == ([1, 121, 122, 123, 124, 125], 4)
    assert quality._windows([5, 6], 8, bos=None) == [([5, 6], 1)]


def test_perplexity_matches_a_direct_computation(models):
    p = quality.perplexity(models["F16"], max_tokens=TOKENS, n_threads=2)
    assert p.n_text_tokens == TOKENS and p.n_ctx == 512 and p.n_windows == 3
    assert p.ppl == pytest.approx(math.exp(p.nll)) and p.nll_stderr > 0
    # A random synthetic model is close to uniform over its 512 tokens.
    assert 200 < p.ppl < 1500
    with LogitsModel(models["F16"], n_ctx=512, n_threads=2) as lm:
        tokens = lm.tokenize(quality.default_text())[:TOKENS]
        nll = []
        for window, first in quality._windows(tokens, 512, lm.bos):
            logits = lm.window_logits(window, first).astype(np.float64)
            logp = (
                logits
                - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
                - logits.max(1, keepdims=True)
            )
            nll += list(-logp[np.arange(len(logits)), window[first:]])
    assert len(nll) == p.n_scored
    assert p.nll == pytest.approx(float(np.mean(nll)), rel=1e-6)


def test_kl_orders_the_quant_levels(models):
    q8, q4, same = quality.compare_many(
        models["F16"], [models["Q8_0"], models["Q4_0"], models["F16"]], max_tokens=TOKENS, n_threads=2
    )
    assert same.kl_mean == 0.0 and same.top1_agreement == 1.0 and same.kl_max == 0.0
    assert 0 < q8.kl_mean < q4.kl_mean
    assert q8.top1_agreement > q4.top1_agreement
    assert q8.kl_median <= q8.kl_p99 <= q8.kl_max
    assert q8.base.ppl == q4.base.ppl == same.other.ppl
    single = quality.compare(models["F16"], models["Q4_0"], max_tokens=TOKENS, n_threads=2)
    assert single.kl_mean == pytest.approx(q4.kl_mean, rel=1e-9)


def test_kl_matches_a_direct_computation(models):
    c = quality.compare(models["F16"], models["Q4_0"], max_tokens=600, n_ctx=256, n_threads=2)
    kls = []
    with LogitsModel(models["F16"], n_ctx=256) as a, LogitsModel(models["Q4_0"], n_ctx=256) as b:
        tokens = a.tokenize(quality.default_text())[:600]
        for window, first in quality._windows(tokens, 256, a.bos):
            la = a.window_logits(window, first).astype(np.float64)
            lb = b.window_logits(window, first).astype(np.float64)
            pa = np.exp(la - la.max(1, keepdims=True))
            pa /= pa.sum(1, keepdims=True)
            pb = np.exp(lb - lb.max(1, keepdims=True))
            pb /= pb.sum(1, keepdims=True)
            kls += list((pa * (np.log(pa) - np.log(pb))).sum(1))
    assert c.kl_mean == pytest.approx(float(np.mean(kls)), rel=1e-4)


def test_different_vocabularies_are_refused(models, tmp_path):
    other = build_synthetic_model(SynthConfig(n_vocab=600), tmp_path / "v600.gguf")
    with pytest.raises(QuantError, match="different vocabularies: 512 tokens .* 600"):
        quality.compare(models["F16"], other)


def test_bad_quality_input(models, tmp_path):
    with pytest.raises(InvalidParameterError):
        quality.perplexity(models["F16"], n_ctx=4)
    with pytest.raises(QuantError, match="cannot read text file"):
        quality.perplexity(models["F16"], text=tmp_path / "missing.txt")
    (tmp_path / "short.txt").write_text("")
    with pytest.raises(QuantError, match="too short"):
        quality.perplexity(models["F16"], text=tmp_path / "short.txt")


def test_cli_quality(models, tmp_path, capsys):
    assert main(["quality", str(models["F16"]), "--max-tokens", "300", "--no-progress"]) == 0
    assert "perplexity" in capsys.readouterr().out
    args = ["quality", str(models["F16"]), str(models["Q4_0"]), "--max-tokens", "300", "--json", "--no-progress"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kl_mean"] > 0 and 0 < data["top1_agreement"] <= 1 and data["base"]["n_scored"] > 0
    other = build_synthetic_model(SynthConfig(n_vocab=600), tmp_path / "v600.gguf")
    assert main(["quality", str(models["F16"]), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different vocabularies" in err
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00")
    assert main(["quality", str(tmp_path / "x.gguf")]) == 2


@pytest.mark.default_model
def test_default_model_q8_is_closer_than_q4(default_model, tmp_path):
    """On the real model (a few hundred tokens): Q8_0 stays closer to the source than Q4_0."""
    q8 = quantize(default_model, tmp_path / "q8.gguf", "Q8_0", allow_requantize=True)
    q4 = quantize(default_model, tmp_path / "q4.gguf", "Q4_0", allow_requantize=True)
    c8, c4 = quality.compare_many(default_model, [q8, q4], max_tokens=300, n_ctx=256)
    assert 0 < c8.kl_mean < c4.kl_mean
    assert c8.top1_agreement >= c4.top1_agreement
    assert 1 < c8.base.ppl < 200
