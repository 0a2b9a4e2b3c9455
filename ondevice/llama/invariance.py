"""How many tokens one llama_decode can take and still give every position the logits that
decoding them one at a time gives, bit for bit (speculative decoding's verify step must, for
its output to be plain decoding's).

Not every kernel is batch-invariant: llama.cpp's CPU_REPACK matrix product runs batches of 4+
rows through a 4-row GEMM and smaller ones through a GEMV that rounds differently (figures in
benchmarks/README.md); other paths change at 8 tokens. So it is measured, on a context of its own with the
engine's settings: a short text decoded token by token, then the same tokens in one batch of n, for n found by
bisection.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ondevice.llama.model import fill_batch, new_context

__all__ = ["batch_invariant_tokens"]

_PROMPT = 4  # tokens decoded first, so the batch attends to a cache as a verify step does


def batch_invariant_tokens(
    model: Any, tokens: Sequence[int], *, n_threads: int, lib: Any = None, **context: Any
) -> int:
    """The largest n <= len(tokens) - 4 for which one decode of tokens[4:4+n] (after tokens[:4])
    gives logits equal, bit for bit, to decoding them one by one (assumed to hold for every
    smaller n). `context`: new_context's settings (flash_attn_type, type_k, type_v, n_ubatch)."""
    if lib is None:
        import llama_cpp as lib
    prompt, cont = list(tokens[:_PROMPT]), list(tokens[_PROMPT:])
    if len(cont) <= 1:
        return len(cont)
    n_ctx = max(256, -(-(len(tokens) + 1) // 256) * 256)
    ctx, _ = new_context(model, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_ctx, lib=lib, **context)
    batch = lib.llama_batch_init(len(tokens), 0, 1)
    n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
    mem = lib.llama_get_memory(ctx)

    def decode(toks: list[int], pos0: int) -> None:
        fill_batch(batch, toks, pos0, lambda i: True)
        if lib.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def row(i: int) -> np.ndarray:
        ptr = lib.llama_get_logits_ith(ctx, i)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()

    try:
        decode(prompt, 0)
        ref = []
        for j, t in enumerate(cont):
            decode([t], len(prompt) + j)
            ref.append(row(0))

        def same(n: int) -> bool:
            lib.llama_memory_seq_rm(mem, 0, len(prompt), -1)
            decode(cont[:n], len(prompt))
            return all(np.array_equal(row(i), ref[i]) for i in range(n))

        lo, hi = 1, len(cont)  # decoding 1 token is the reference itself
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if same(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo
    except RuntimeError:
        return 1
    finally:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
