"""Engine.sibling: another engine on the same loaded model with a cache of its own (probing.timing pairs a long
context with a short one on it)."""

from __future__ import annotations

import pytest

from ondevice.core.errors import EngineError, InvalidParameterError
from ondevice.engine import load


def test_a_sibling_shares_the_model_not_the_cache(tiny_model):
    with load(tiny_model, n_ctx=512, n_threads=1) as eng:
        sibling = eng.sibling(64)
        assert sibling._h.model == eng._h.model and not sibling._h.owns_model  # the weights loaded once
        assert sibling.n_ctx == 256  # llama.cpp's smallest context
        assert (sibling.info.n_threads, sibling.info.cache_type_k) == (eng.info.n_threads, eng.info.cache_type_k)
        assert sibling.predictor is None
        prompt = [1, 40, 41, 42]
        mine = eng.generate(prompt, max_tokens=5, ignore_eos=True, temperature=0.0)
        sibling.generate(prompt + [7, 8], max_tokens=5, ignore_eos=True, temperature=0.0)
        # its request left the engine's cache alone: the engine's repeated prompt reuses all but its last token
        assert eng.cached_prefix(prompt) == len(prompt) - 1 and sibling.kv_cache_tokens == len(prompt) + 2 + 4
        assert eng.generate(prompt, max_tokens=5, ignore_eos=True, temperature=0.0).token_ids == mine.token_ids
        assert (
            sibling.generate(prompt, max_tokens=5, ignore_eos=True, temperature=0.0, reuse_prefix=False).token_ids
            == mine.token_ids
        )
    assert sibling._closed  # closed with the engine, before the model they shared
    with pytest.raises(EngineError, match="closed"):
        sibling.generate([1, 40], max_tokens=1)


def test_a_sibling_closed_first_leaves_the_engine_working(tiny_model):
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        with eng.sibling(256) as sibling:
            sibling.generate([1, 40], max_tokens=2, ignore_eos=True)
        assert eng.generate([1, 40], max_tokens=2, ignore_eos=True).token_ids
        with pytest.raises(InvalidParameterError, match="n_ctx"):
            eng.sibling(0)
    with pytest.raises(EngineError, match="closed"):
        eng.sibling(256)
