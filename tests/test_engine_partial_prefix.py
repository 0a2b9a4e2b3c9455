"""A request that shares only part of its prompt with the cached one, against the same request with
reuse_prefix=False, on several weight types (README: The same request twice gives the same answer).

llama.cpp computes a prompt in micro-batches of n_ubatch tokens from position 0. A micro-batch's results depend on
its own tokens and the cache before it, so a cached prefix that ends on a micro-batch boundary (and was prefilled
from position 0) holds exactly what a whole prefill computes there, and the new tokens start a micro-batch as they
would in it: the logits agree bit for bit. A prefix that ends inside a micro-batch has its new tokens computed in a
batch that starts elsewhere, where the kernels round differently; that path is itself repeatable.
The random synthetic model has nearly flat logits, so any rounding difference shows.
"""

from __future__ import annotations

import ctypes

import pytest
from ondevice.quant.quantize import quantize
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.engine import load

WEIGHT_TYPES = ["Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"]  # pure: every matrix of that type
N_UBATCH = 32  # a small micro-batch keeps the prompts short
TEXT = " ".join(["the people of the world are in the city of paris and the river runs to the sea while"] * 4)
CACHED_TAIL = " a green mountain by the old bridge and the quiet garden window"
NEW_TAIL = " seven small rooms of the school" * 8


@pytest.fixture(scope="module")
def f16_model(synth_dir):
    cfg = SynthConfig(d_model=256, d_ff=512, n_vocab=512, seed=5)
    return build_synthetic_model(cfg, synth_dir / "partial-f16.gguf")


def model_of_type(f16_model, synth_dir, weight_type: str):
    if weight_type == "F16":
        return f16_model
    path = synth_dir / f"partial-{weight_type.lower()}.gguf"
    return path if path.exists() else quantize(f16_model, path, weight_type, threads=1, pure=True)


def first_step(engine, ids, **kw):
    """The greedy request's tokens, its cached prompt tokens and the logits its first token came from (bytes)."""
    g = engine.generate(ids, max_tokens=12, temperature=0, ignore_eos=True, **kw)
    engine.generate(ids, max_tokens=1, temperature=0, **kw)  # the same first step, its logits left in the context
    h = engine._h
    return g.token_ids, g.cached_prompt_tokens, ctypes.string_at(h.lib.llama_get_logits_ith(h.ctx, -1), 4 * h.n_vocab)


def prompts(engine, shared: int, n_new: int) -> tuple[list[int], list[int]]:
    """(the cached request's prompt, the new one's): the first `shared` tokens in common."""
    head = engine.tokenize(TEXT)[:shared]
    cached = head + engine.tokenize(CACHED_TAIL, add_bos=False)[:5]
    return cached, head + engine.tokenize(NEW_TAIL, add_bos=False)[:n_new]


def partial_reuse(engine, cached: list[int], new: list[int]):
    """first_step of `new` after `cached` was prefilled from position 0 (its repeat inside first_step samples from
    the logits kept with the cache: those of the partial reuse)."""
    engine.reset()
    engine.generate(cached, max_tokens=1, temperature=0)
    return first_step(engine, new)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_prefix_on_a_micro_batch_boundary_gives_the_whole_prefill(f16_model, synth_dir, weight_type):
    path = model_of_type(f16_model, synth_dir, weight_type)
    with load(path, n_ctx=512, n_threads=2, n_batch=N_UBATCH, n_ubatch=N_UBATCH) as engine:
        for shared, n_new in ((2 * N_UBATCH, 1), (2 * N_UBATCH, 5), (3 * N_UBATCH, 33)):
            cached, new = prompts(engine, shared, n_new)
            tokens, n_cached, logits = partial_reuse(engine, cached, new)
            whole_tokens, whole_cached, whole_logits = first_step(engine, new, reuse_prefix=False)
            assert n_cached == shared and whole_cached == 0
            assert tokens == whole_tokens, (shared, n_new)
            assert logits == whole_logits, (shared, n_new)  # bit for bit


@pytest.mark.parametrize("weight_type", ["Q4_0", "Q8_0", "F16"])
def test_prefix_inside_a_micro_batch_is_repeatable(f16_model, synth_dir, weight_type):
    path = model_of_type(f16_model, synth_dir, weight_type)
    with load(path, n_ctx=512, n_threads=2, n_batch=N_UBATCH, n_ubatch=N_UBATCH) as engine:
        cached, new = prompts(engine, 2 * N_UBATCH + 6, 9)
        first = partial_reuse(engine, cached, new)
        assert first[1] == 2 * N_UBATCH + 6
        assert partial_reuse(engine, cached, new) == first  # the same path gives the same tokens and logits
