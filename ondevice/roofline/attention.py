"""Attention arithmetic: how many cached tokens a decode step or a prompt chunk attends to, over
every layer (sliding-window layers count at most their window).

The measured step times (timing.py) are spread over contexts with these counts: what a model's
timing measured at one context or chunk position becomes another's by the difference in cells.
"""

from __future__ import annotations

from ondevice.gguf.spec import ModelSpec

__all__ = ["causal_spans", "decode_spans", "chunk_cells", "added_chunk_cells", "attention_head_dims"]


def causal_spans(p0: int, p1: int, window: int | None = None) -> float:
    """Cached tokens attended by the prompt tokens at positions p0..p1-1 (token i attends i+1,
    at most `window`): sum over i of min(i + 1, window)."""

    def upto(p: int) -> float:  # tokens 0..p-1
        if not window or p <= window:
            return p * (p + 1) / 2
        return window * (window + 1) / 2 + (p - window) * window

    return upto(p1) - upto(p0)


def _windows(spec: ModelSpec) -> tuple[int | None, ...]:
    """Per layer: its sliding window, or None (the whole context)."""
    swa = set(spec.swa_layers) if spec.sliding_window else set()
    return tuple(spec.sliding_window if i in swa else None for i in range(spec.n_layer or 0))


def decode_spans(spec: ModelSpec, n_ctx: int) -> float:
    """Cached tokens one decode step at a context of n_ctx tokens attends to, summed over the layers."""
    n = max(0, int(n_ctx))
    return float(sum(min(n, w) if w else n for w in _windows(spec)))


def chunk_cells(spec: ModelSpec, pos: int, n_tokens: int) -> float:
    """Attention cells of a chunk of n_tokens after pos cached tokens (each token attends itself and
    what precedes it, windows capped), summed over the layers."""
    p0, p1 = max(0, int(pos)), max(0, int(pos)) + max(0, int(n_tokens))
    return float(sum(causal_spans(p0, p1, w) for w in _windows(spec)))


def added_chunk_cells(spec: ModelSpec, pos: int, n_tokens: int) -> float:
    """The attention cells a chunk of n_tokens after pos cached tokens has beyond the same chunk from an empty
    cache (what attending the cached tokens adds), summed over the layers."""
    return chunk_cells(spec, pos, n_tokens) - chunk_cells(spec, 0, n_tokens)


def attention_head_dims(spec: ModelSpec) -> int:
    """Head dimensions one attention score works through: the key's (dot product) plus the
    value's (weighted sum); 0 when unknown."""
    return (spec.head_dim_k or 0) + (spec.head_dim_v or 0)
