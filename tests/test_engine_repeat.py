"""The same greedy request twice in one engine gives the same tokens with prefix reuse on, for every weight type.

The repeated request finds its whole prompt in the KV cache. Recomputing the last prompt token alone (a
one-token batch) rounds differently from that token inside the prompt's batch; the engine keeps the
prompt's last logits beside the cache instead, so the second request samples from exactly what the first
did. The random synthetic model has nearly flat logits, so any rounding difference changes greedy tokens.
"""

from __future__ import annotations

import ctypes

import pytest
from ondevice.quant.quantize import quantize
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.engine import load

# pure quantization: Q4_K_M / Q5_K_M put every matrix in Q4_K / Q5_K
WEIGHT_TYPES = ["Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"]
# long enough that the prompt batch and a one-token batch take different kernel paths
PROMPT = " ".join(["the people of the world are in the city of paris and the river runs to the sea while"] * 4)


@pytest.fixture(scope="module")
def f16_model(synth_dir):
    cfg = SynthConfig(d_model=256, d_ff=512, n_vocab=512, seed=5)
    return build_synthetic_model(cfg, synth_dir / "repeat-f16.gguf")


def model_of_type(f16_model, synth_dir, weight_type: str):
    if weight_type == "F16":
        return f16_model
    return quantize(f16_model, synth_dir / f"repeat-{weight_type.lower()}.gguf", weight_type, threads=1, pure=True)


def greedy(engine, prompt, **kw):
    kw.setdefault("max_tokens", 16)
    return engine.generate(prompt, temperature=0, ignore_eos=True, **kw)


def first_token_logits(engine, prompt, **kw) -> bytes:
    """The logits the request's only token was sampled from (the context's last output row), as bytes."""
    greedy(engine, prompt, max_tokens=1, **kw)
    h = engine._h
    row = h.lib.llama_get_logits_ith(h.ctx, -1)
    return ctypes.string_at(row, 4 * h.n_vocab)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_repeated_request_is_identical_with_prefix_reuse(f16_model, synth_dir, weight_type):
    path = model_of_type(f16_model, synth_dir, weight_type)
    with load(path, n_ctx=512, n_threads=2) as engine:
        first = greedy(engine, PROMPT)
        again = greedy(engine, PROMPT)
        cold = greedy(engine, PROMPT, reuse_prefix=False)
        ids = engine.tokenize(PROMPT)
        # the whole prompt came from the cache, its last logits included: nothing was recomputed
        assert again.cached_prompt_tokens == len(ids) and again.timings.prompt_tokens_computed == 0
        assert again.token_ids == first.token_ids == cold.token_ids
        assert again.text == first.text
        # bit for bit: the first token of the repeat is sampled from the very logits the first request saw
        assert first_token_logits(engine, PROMPT) == first_token_logits(engine, PROMPT)


def test_kept_logits_follow_the_cache(f16_model):
    """A different prompt in between replaces the kept logits; the first prompt again still repeats itself."""
    with load(f16_model, n_ctx=512, n_threads=2) as engine:
        first = greedy(engine, PROMPT)
        other = greedy(engine, "a different prompt entirely")
        assert other.cached_prompt_tokens <= 1  # at most the BOS token is shared
        back = greedy(engine, PROMPT, reuse_prefix=False)
        again = greedy(engine, PROMPT)
        assert back.token_ids == first.token_ids == again.token_ids
        engine.reset()
        assert greedy(engine, PROMPT).cached_prompt_tokens == 0  # a cleared cache keeps no logits
