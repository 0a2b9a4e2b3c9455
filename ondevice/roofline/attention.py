"""Attention arithmetic: how many cached tokens a decode step or a prompt chunk attends to, over
every layer that attends (sliding-window layers count at most their window; a hybrid's recurrent
layers, which hold no KV cache, none: ModelSpec.attention_layers).

The measured step times (timing.py) are spread over contexts with these counts: what a model's
timing measured at one context or chunk position becomes another's by the difference in cells.
"""

from __future__ import annotations

from ondevice.gguf.spec import ModelSpec

__all__ = [
    "causal_spans",
    "decode_spans",
    "decode_kv_padding",
    "chunk_cells",
    "added_chunk_cells",
    "attention_head_dims",
    "KV_VIEW_PAD",
]

KV_VIEW_PAD = 256  # llama.cpp attends a view of the KV cells in use rounded up to this many (llama_kv_cache::get_n_kv)
_SPLIT_FROM = 512  # CPU flash attention splits one token's attention over the view by threads from this many cells


def causal_spans(p0: int, p1: int, window: int | None = None) -> float:
    """Cached tokens attended by the prompt tokens at positions p0..p1-1 (token i attends i+1,
    at most `window`): sum over i of min(i + 1, window)."""

    def upto(p: int) -> float:  # tokens 0..p-1
        if not window or p <= window:
            return p * (p + 1) / 2
        return window * (window + 1) / 2 + (p - window) * window

    return upto(p1) - upto(p0)


def _windows(spec: ModelSpec) -> tuple[int | None, ...]:
    """Per layer that attends: its sliding window, or None (the whole context)."""
    swa = set(spec.swa_layers) if spec.sliding_window else set()
    return tuple(spec.sliding_window if i in swa else None for i in spec.attention_layers)


def decode_spans(spec: ModelSpec, n_ctx: int, kv_pad: int = 1, pad_from: int = 0) -> float:
    """Cached tokens one decode step at a context of n_ctx tokens attends to, summed over the layers (windowed
    layers at most their window). With kv_pad > 1, what the step costs in cells: once the view llama.cpp attends
    (the cells in use, this token's included, rounded up to kv_pad) holds pad_from cells or more, the whole view
    (decode_kv_padding says when); below that, the cells in use."""
    n = max(0, int(n_ctx))
    if kv_pad > 1:
        view = -(-(n + 1) // kv_pad) * kv_pad
        n = view if view >= pad_from else n
    return float(sum(min(n, w) if w else n for w in _windows(spec)))


def decode_kv_padding(backend: str, flash_attn_used: bool | None, type_k: str, type_v: str) -> tuple[int, int]:
    """(kv_pad, pad_from) of decode_spans for an engine: what a decode step's attention costs on it. On the CPU with
    flash attention over an f16 or f32 cache (K and V of one type), llama.cpp splits a single token's attention over
    the view into one equal share per thread from _SPLIT_FROM cells on; the first shares hold only cells in use, the
    last the masked padding, and the step waits for the slowest: it costs the whole view, a step function of the
    context in KV_VIEW_PAD-cell stairs. Below that, and with a quantized cache (each thread takes whole heads and skips
    the masked cells), the cells in use. Elsewhere (other backends' kernels; no flash attention, where the CPU's
    steps on Qwen3 0.6B showed neither form clearly) the cells in use, as before this was measured."""
    same_plain = type_k.lower() == type_v.lower() and type_k.lower() in ("f16", "f32")
    if backend.upper() == "CPU" and flash_attn_used is not False and same_plain:
        return KV_VIEW_PAD, _SPLIT_FROM
    return 1, 0


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
